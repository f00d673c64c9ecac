//! The local cloud's command line (what `scripts/dev-stack` and `scripts/demo` run):
//!
//! ```text
//! nodesmith-local stack [--env-file PATH]   run until SIGINT/SIGTERM; print (and write) the exports
//! nodesmith-local demo [--json] [--replicas N] [--faults]
//! nodesmith-local burst [--json] [--pods N] [--deployments N]
//! nodesmith-local bench-scale [--nodes N] [--pods-per-node P] [--scenario claims,pods,sweep,provision,interrupt,storm]
//! nodesmith-local bench-scale-function    (the harness's own: one function's run, handed over on stdin)
//! ```
//!
//! The function and forwarder binaries are expected next to this one.

use std::path::PathBuf;
use std::process::ExitCode;

use nodesmith_tests::bench_scale::{self, BenchOptions, Scenario};
use nodesmith_tests::local_cloud::burst::{self, BurstOptions};
use nodesmith_tests::local_cloud::demo::{self, DemoOptions};
use nodesmith_tests::local_cloud::{LocalCloud, Settings, write_atomically};

const USAGE: &str = "usage: nodesmith-local stack [--env-file PATH] | nodesmith-local demo [--json] [--replicas N] [--faults] | nodesmith-local burst [--json] [--pods N] [--deployments N] | nodesmith-local bench-scale [--nodes N] [--pods-per-node P] [--scenario burst,claims,pods,sweep,provision,interrupt,storm] [--burst-pods N]";

fn settings() -> Result<Settings, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let bin_dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    Settings::from_lookup(|k| std::env::var(k).ok(), bin_dir).map_err(|e| e.to_string())
}

async fn stop_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn stack(env_file: Option<PathBuf>) -> Result<(), String> {
    let cloud = tokio::select! {
        c = LocalCloud::start(settings()?) => c.map_err(|e| e.to_string())?,
        _ = stop_signal() => return Ok(()),
    };
    let exports = cloud.exports();
    if let Some(path) = &env_file
        && let Err(e) = write_atomically(path, &exports)
    {
        cloud.stop().await;
        return Err(format!("{}: {e}", path.display()));
    }
    print!("{exports}");
    eprintln!(
        "local cloud ready (logs in {}); stop with Ctrl-C or SIGTERM",
        cloud.log_dir().display()
    );
    stop_signal().await;
    eprintln!("stopping the local cloud");
    cloud.stop().await;
    Ok(())
}

async fn run_demo(json: bool, replicas: usize, faults: bool) -> Result<bool, String> {
    let mut out = std::io::stdout();
    println!("starting the local cloud (moto, the Kubernetes API test server, the four functions, the forwarder)");
    let started = std::time::Instant::now();
    let cloud = LocalCloud::start(settings()?).await.map_err(|e| e.to_string())?;
    println!("ready in {:.1} s", started.elapsed().as_secs_f64());
    let options = DemoOptions {
        replicas,
        faults,
        ..DemoOptions::default()
    };
    let result = tokio::select! {
        r = demo::run(&cloud, &options, &mut out) => Some(r),
        _ = stop_signal() => None,
    };
    cloud.stop().await;
    let Some(result) = result else {
        return Err("interrupted".into());
    };
    let summary = result.map_err(|e| e.to_string())?;
    print_report("summary", &summary, json)?;
    Ok(summary.ok)
}

/// Prints a report as a table, and with `json` as one JSON line last.
fn print_report(title: &str, report: &impl serde::Serialize, json: bool) -> Result<(), String> {
    println!("\n== {title}");
    let v = serde_json::to_value(report).map_err(|e| e.to_string())?;
    if let Some(m) = v.as_object() {
        for (k, val) in m {
            println!("   {k:<32} {val}");
        }
    }
    if json {
        println!("{v}");
    }
    Ok(())
}

/// The options of `demo` and `burst`.
#[derive(Default)]
struct Flags {
    json: bool,
    faults: bool,
    replicas: Option<usize>,
    pods: Option<usize>,
    deployments: Option<usize>,
}

impl Flags {
    fn parse(args: &[&str]) -> Result<Flags, String> {
        let mut f = Flags::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut number = |name: &str| {
                it.next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| format!("{name} needs a number"))
            };
            match *a {
                "--json" => f.json = true,
                "--faults" => f.faults = true,
                "--replicas" => f.replicas = Some(number("--replicas")?),
                "--pods" => f.pods = Some(number("--pods")?),
                "--deployments" => f.deployments = Some(number("--deployments")?),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(f)
    }
}

async fn run_burst(json: bool, options: BurstOptions) -> Result<bool, String> {
    let mut out = std::io::stdout();
    println!(
        "starting the local cloud; then {} pods across {} Deployments go pending at once",
        options.pods, options.deployments
    );
    let cloud = LocalCloud::start(settings()?).await.map_err(|e| e.to_string())?;
    let result = tokio::select! {
        r = burst::run(&cloud, &options, &mut out) => Some(r),
        _ = stop_signal() => None,
    };
    cloud.stop().await;
    let report = result.ok_or("interrupted")??;
    print_report("burst", &report, json)?;
    Ok(report.seconds_to_all_running.is_some() && report.double_launches == 0 && report.leaked_instances == 0)
}

/// `bench-scale`: one JSON line per scenario on stdout, progress on stderr.
fn bench_scale(args: &[&str]) -> Result<BenchOptions, String> {
    let mut options = BenchOptions::default();
    let mut burst_pods = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let number = || value.parse::<usize>().map_err(|_| format!("{a} needs a number"));
        match *a {
            "--nodes" => options.nodes = number()?,
            "--pods-per-node" => options.pods_per_node = number()?,
            "--scenario" => {
                let names: Vec<&str> = value.split(',').collect();
                if !names.contains(&bench_scale::BURST) {
                    options.burst = None;
                }
                options.scenarios = names
                    .into_iter()
                    .filter(|s| *s != bench_scale::BURST)
                    .map(|s| Scenario::parse(s).ok_or_else(|| format!("unknown scenario {s:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--burst-pods" => burst_pods = Some(number()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (burst_pods, &mut options.burst) {
        (None, _) => {}
        // 200 pods a Deployment, as in the 20,000-pod burst's 100.
        (Some(pods), Some(b)) => {
            b.pods = pods;
            b.deployments = pods.div_ceil(200);
        }
        (Some(_), None) => return Err("--burst-pods needs the burst among the scenarios".into()),
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // More workers than cores: the Kubernetes API test server's handlers wait
    // on its store's lock, and with one worker a core a burst's waits held up
    // the Lambda runtime, the fault proxy and the pollers of this process.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| {
        if args.first().map(String::as_str) == Some("stack") {
            "info"
        } else {
            "warn"
        }
        .into()
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["stack"] => runtime.block_on(stack(None)).map(|_| true),
        ["stack", "--env-file", path] => runtime.block_on(stack(Some(PathBuf::from(path)))).map(|_| true),
        [command @ ("demo" | "burst"), rest @ ..] => match Flags::parse(rest) {
            Err(b) => Err(format!("{b}\n{USAGE}")),
            Ok(f) if *command == "demo" && f.pods.is_none() && f.deployments.is_none() => {
                runtime.block_on(run_demo(f.json, f.replicas.unwrap_or(100), f.faults))
            }
            Ok(f) if *command == "burst" && f.replicas.is_none() && !f.faults => {
                let defaults = BurstOptions::default();
                let options = BurstOptions {
                    pods: f.pods.unwrap_or(defaults.pods),
                    deployments: f.deployments.unwrap_or(defaults.deployments),
                    ..defaults
                };
                runtime.block_on(run_burst(f.json, options))
            }
            Ok(_) => Err(format!("an option that {command} does not take\n{USAGE}")),
        },
        ["bench-scale", rest @ ..] => match bench_scale(rest) {
            Err(b) => Err(format!("{b}\n{USAGE}")),
            Ok(options) => runtime
                .block_on(bench_scale::run(
                    &options,
                    &mut |line| println!("{line}"),
                    &mut |note| eprintln!("bench-scale: {note}"),
                ))
                .map(|_| true),
        },
        // The harness's own: one function's run in a process of its own (its run on stdin).
        [bench_scale::FUNCTION_COMMAND] => {
            let mut input = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut input)
                .map_err(|e| format!("cannot read the run: {e}"))
                .and_then(|_| runtime.block_on(bench_scale::run_function(&input)))
                .and_then(|answer| serde_json::to_string(&answer).map_err(|e| e.to_string()))
                .map(|line| {
                    println!("{line}");
                    true
                })
        }
        _ => Err(USAGE.to_string()),
    };
    // Lingering tasks (watch streams) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("nodesmith-local: {e}");
            ExitCode::from(2)
        }
    }
}
