//! How long a cold start spends on the built-in catalog: parsing the
//! embedded snapshot into a `Catalog` (what `builtin()` does once), and
//! resolving it for one kubelet configuration. Results are returned, not
//! dropped inside the timing, since `builtin()` keeps its catalog for good.

use criterion::{Criterion, criterion_main};
use nodesmith::catalog::builtin::{CatalogSnapshot, SNAPSHOT_JSON};

fn load(c: &mut Criterion) {
    c.bench_function("builtin catalog: parse snapshot JSON only", |b| {
        b.iter_with_large_drop(|| CatalogSnapshot::parse(std::hint::black_box(SNAPSHOT_JSON)))
    });
    c.bench_function("builtin catalog: parse snapshot + build catalog", |b| {
        b.iter_with_large_drop(|| {
            CatalogSnapshot::parse(std::hint::black_box(SNAPSHOT_JSON)).and_then(|s| s.into_catalog())
        })
    });
    if let Ok(catalog) = CatalogSnapshot::parse(SNAPSHOT_JSON).and_then(|s| s.into_catalog()) {
        c.bench_function("builtin catalog: resolve all types (default kubelet)", |b| {
            b.iter_with_large_drop(|| catalog.resolve(None))
        });
    }
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::load);
}
criterion_main!(group::benches);
