//! A three-node cluster on felix-testkit's `ClusterNet`: what clients see, frame by frame.

use felix_engine::{DeclaredCache, DeclaredStream};
use felix_testkit::*;

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    s.streams.push(DeclaredStream::new("t1", "default", "orders", 3));
    s.caches.push(DeclaredCache::new("t1", "default", "sessions", 1));
    s
}

#[test]
fn probe() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    eprintln!("settled at {:?}", c.now.elapsed());
    for i in 0..3 {
        let p = c.connect(i);
        let (id, auth) = c.nodes[i].auth_stream(p);
        eprintln!("auth {}", text(&auth));
        let f = c.nodes[i].exchange(p, id, &json_frame(r#"{"type":"topology"}"#));
        eprintln!("{}", text(&f[0]));
        let f = c.nodes[i].exchange(p, id, &json_frame(r#"{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"orders","kind":"stream","request_id":3}"#));
        eprintln!("{}", text(&f[0]));
    }
}
