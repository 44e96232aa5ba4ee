//! The embedding example (`examples/embed.rs`) is a test too: the same code, under
//! `cargo test`, on tokio.

#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod embed;

#[tokio::test]
async fn the_embedding_example_runs_on_tokio() {
    let dir = std::env::temp_dir().join(format!("felix-embed-test-tokio-{}", std::process::id()));
    let received = tokio::time::timeout(std::time::Duration::from_secs(30), embed::run(&dir))
        .await
        .expect("in time")
        .expect("the example runs");
    assert_eq!(received, vec!["order-1", "order-2"]);
    // The logs hold what was published: a restart would find it.
    assert!(std::fs::read_dir(&dir).unwrap().next().is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}
