//! How long a cold start spends on the built-in catalog: parsing the
//! embedded snapshot into a `Catalog`, and resolving it for one kubelet
//! configuration.

use criterion::{Criterion, criterion_group, criterion_main};
use nodesmith::catalog::builtin::{SNAPSHOT_JSON, Snapshot};

fn load(c: &mut Criterion) {
    c.bench_function("builtin catalog: parse snapshot + build catalog", |b| {
        b.iter(|| Snapshot::parse(std::hint::black_box(SNAPSHOT_JSON)).and_then(|s| s.to_catalog()).map(|c| c.instance_types.len()))
    });
    c.bench_function("builtin catalog: parse snapshot JSON only", |b| b.iter(|| Snapshot::parse(std::hint::black_box(SNAPSHOT_JSON)).map(|s| s.instance_types.len())));
    let catalog = Snapshot::parse(SNAPSHOT_JSON).and_then(|s| s.to_catalog()).ok();
    if let Some(catalog) = catalog {
        c.bench_function("builtin catalog: resolve all types (default kubelet)", |b| b.iter(|| catalog.resolve(None).len()));
    }
}

criterion_group!(benches, load);
criterion_main!(benches);
