// Planted to show the tidy test failing; removed by the next commit.
#[path = "frame.rs"]
mod planted;
