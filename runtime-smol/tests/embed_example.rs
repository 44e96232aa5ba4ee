//! The embedding example (`examples/embed.rs`) is a test too: the same code, under
//! `cargo test`, on smol (broker and client), with no tokio runtime anywhere.

#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod embed;

#[test]
fn the_embedding_example_runs_on_smol() {
    let dir = std::env::temp_dir().join(format!("felix-embed-test-smol-{}", std::process::id()));
    let received = smol::block_on(async {
        let deadline = async {
            smol::Timer::after(std::time::Duration::from_secs(30)).await;
            Err("timed out".into())
        };
        smol::future::or(embed::run(&dir), deadline).await
    })
    .expect("the example runs in time");
    assert_eq!(received, vec!["order-1", "order-2"]);
    assert!(std::fs::read_dir(&dir).unwrap().next().is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}
