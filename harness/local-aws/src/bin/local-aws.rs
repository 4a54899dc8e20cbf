//! Starts the local server for a shell script, the kit's one way ([`LocalAws::start`]): prints
//! its endpoint once it listens and leaves it running until the script's shell is gone.
//!
//! ```sh
//! LOCAL_AWS_ENDPOINT=$(target/debug/local-aws --parent-pid $$)
//! ```

use std::process::ExitCode;

use aws_sdk_sfn::error::DisplayErrorContext;
use clap::Parser;
use local_aws::server::{LocalAws, Options};

#[derive(Parser)]
#[command(about = "Starts the local AWS (local/moto_server.py) and prints its endpoint")]
struct Args {
    /// The process whose end stops the server: the calling shell (`$$`).
    #[arg(long)]
    parent_pid: u32,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = Options {
        parent_pid: args.parent_pid,
        ..Options::new()
    };
    match LocalAws::start(&options) {
        Ok(server) => {
            eprintln!(
                "local AWS (moto, serialized) at {} (log: {})",
                server.endpoint(),
                server.log().display()
            );
            println!("{}", server.endpoint());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("local-aws: {}", DisplayErrorContext(e));
            ExitCode::FAILURE
        }
    }
}
