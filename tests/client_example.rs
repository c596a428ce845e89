//! The Rust client example (examples/rust_client.rs, a user of the
//! `rlock-client` crate) against real servers: the example is compiled into
//! this test. The library itself is tested in clients/rust/tests.

mod common;

#[allow(dead_code)] // `main` is for the example binary
#[path = "../examples/rust_client.rs"]
mod rust_client;

use common::*;

#[test]
fn the_example_runs_against_three_servers() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let log = rust_client::demo(&ports).unwrap();
    let text = log.join("\n");
    for expected in [
        "still held after 700 ms with a 300 ms lease: true",
        "renewed by the server, no renewal thread: true",
        "released on drop: true",
        "worker-a held demo:shared",
        "worker-b held demo:shared",
        "pub/sub waiter acquired after release: true",
        "pub/sub holder kept by its renewal thread: true",
        "multi-lock holds 2 keys, one token each: true",
        "multi-lock released every key: true",
        "redlock granted by 3 of 3 servers",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    // The two workers' tenures have distinct tokens (which one went first is
    // up to the scheduler).
    let tokens: Vec<i64> = log
        .iter()
        .filter(|l| l.contains("held demo:shared with token"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 2);
    assert_ne!(tokens[0], tokens[1]);
    // Nothing left behind on any server.
    for s in &servers {
        let mut c = s.client();
        let n: i64 = cmd("DBSIZE").query(&mut c).unwrap();
        assert_eq!(n, 0, "the example left a lock behind");
    }
}
