//! (w) Parked waiters' memory, per server.

use std::fmt::Write as _;

use super::num;
use crate::Results;

pub fn render_waiter_memory(w: &mut String, r: &Results) {
    if r.waiter_memory.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n## (w) Memory of a parked waiter, per server\n");
    let _ = writeln!(
        w,
        "N clients, each on its own connection, parked on one held lock \
         (`RLOCK.ACQUIRE held w<i> BLOCK 0`) against N clients in `BLPOP empty 0`, on a fresh \
         server each. Bytes per client: growth of `used_memory` from before the clients \
         connected to all of them parked (the connection itself included, as a user pays it). \
         Then every client disconnects; left: `used_memory` above the baseline 1 s and 10 s \
         later, per client that was parked (the next server is measured during a server's \
         10 s; only one has clients at a time). A module's blocked client carries a reply client \
         of its own (Redis's `RM_BlockClientOnKeys`), which `BLPOP` does not: that is most of \
         the difference, and no module API lets a blocked client go without it.\n"
    );
    let _ = writeln!(
        w,
        "| server | waiter | clients | bytes per client | vs BLPOP | left after 1 s | left after 10 s |\n|---|---|---|---|---|---|---|"
    );
    for x in &r.waiter_memory {
        let blpop = r
            .waiter_memory
            .iter()
            .find(|b| !b.native && b.server == x.server);
        let ratio = match (x.native, blpop) {
            (true, Some(b)) if b.bytes_per_waiter > 0.0 => {
                format!("{:.2}x", x.bytes_per_waiter / b.bytes_per_waiter)
            }
            _ => String::new(),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {ratio} | {} | {} |",
            x.server,
            x.label(),
            num(x.waiters as f64),
            num(x.bytes_per_waiter),
            num(x.left_after_1s),
            num(x.left_after_10s)
        );
    }
}
