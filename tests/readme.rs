//! The README's redis-cli walkthroughs (every ```console block), each replayed
//! against a fresh server with `redis-cli --no-raw`: every line must print as
//! documented. Only fencing tokens (clock-derived) and TTLs (counting down) are
//! compared by shape.

mod common;

use std::process::Command;

use common::*;

const PROMPT: &str = "127.0.0.1:6379> ";

/// Every ```console block of the README.
fn walkthroughs() -> Vec<Vec<(String, Vec<String>)>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    readme
        .split("```console\n")
        .skip(1)
        .map(|rest| steps(rest.split("```").next().unwrap_or_default()))
        .collect()
}

/// (command, expected output lines) pairs of one block.
fn steps(block: &str) -> Vec<(String, Vec<String>)> {
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix(PROMPT) {
            Some(command) => steps.push((command.to_string(), Vec::new())),
            None => steps
                .last_mut()
                .expect("output before any command")
                .1
                .push(line.to_string()),
        }
    }
    steps
}

/// Replaces what legitimately varies between runs with a placeholder.
fn normalize(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut after_ttl = false;
    for line in lines {
        let line = line.trim_end();
        let n = if let Some(v) = line.rsplit_once("(integer) ").map(|(_, v)| v) {
            match v.parse::<i64>() {
                Ok(t) if t >= 1 << 40 => line.replace(v, "<token>"),
                Ok(_) if after_ttl => line.replace(v, "<ttl>"),
                _ => line.to_string(),
            }
        } else if let Some((name, _)) = line.split_once("_last_token:") {
            format!("{name}_last_token:<token>")
        } else {
            line.to_string()
        };
        after_ttl = line.ends_with("\"ttl\"");
        out.push(n);
    }
    out
}

#[test]
fn readme_walkthroughs_print_as_documented() {
    let blocks = walkthroughs();
    assert!(
        blocks.len() >= 2,
        "the README has {} walkthroughs",
        blocks.len()
    );
    for steps in blocks {
        assert!(steps.len() >= 10, "walkthrough too short: {steps:?}");
        replay(steps);
    }
}

fn replay(steps: Vec<(String, Vec<String>)>) {
    let s = Server::start();
    for (command, expected) in steps {
        let out = Command::new("redis-cli")
            .arg("--no-raw")
            .arg("-p")
            .arg(s.port.to_string())
            .args(command.split_whitespace())
            .output()
            .unwrap();
        let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        let expected: Vec<String> = expected.into_iter().filter(|l| !l.is_empty()).collect();
        let got: Vec<String> = got.into_iter().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            normalize(&got),
            normalize(&expected),
            "output of `{command}` differs from README"
        );
    }
}

#[test]
fn normalization_keeps_everything_but_tokens_and_ttls() {
    let lines: Vec<String> = [
        "(integer) 1882503151235366912",
        " 9) \"ttl\"",
        "10) (integer) 29967",
        "(integer) 2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        normalize(&lines),
        vec![
            "(integer) <token>",
            " 9) \"ttl\"",
            "10) (integer) <ttl>",
            "(integer) 2"
        ]
    );
}
