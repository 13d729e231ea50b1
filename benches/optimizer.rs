//! Optimizer speed on a large generated catalog.
//!
//! Builds a catalog of 120,000 offerings (GPU and CPU types across many
//! clouds, regions and zones) and plans a 4-node `any_of` task over it.
//! Run: `cargo bench --bench optimizer`. The README quotes the median.

use criterion::{criterion_group, criterion_main, Criterion};
use gangway::catalog::{Catalog, Offering};
use gangway::optimizer::{optimize, Blocklist, Options};
use gangway::spec::parse_str;

const GPUS: &[(&str, f32, f64)] = &[
    ("H200", 8.0, 80.0),
    ("H100", 8.0, 60.0),
    ("H100", 1.0, 8.0),
    ("A100-80GB", 8.0, 30.0),
    ("A100", 8.0, 24.0),
    ("A100", 1.0, 3.5),
    ("L40S", 4.0, 10.0),
    ("L4", 1.0, 0.8),
    ("A10G", 1.0, 1.0),
    ("T4", 1.0, 0.5),
    ("V100", 8.0, 24.0),
];

/// A deterministic catalog of at least `rows` offerings.
fn generated(rows: usize) -> Catalog {
    let mut v = Vec::with_capacity(rows);
    let mut i: u64 = 0;
    let clouds = ["aws", "gcp", "azure", "lambda", "oci"];
    while v.len() < rows {
        i += 1;
        // xorshift for repeatable jitter
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        let jitter = 0.8 + (x % 400) as f64 / 1000.0;
        let cloud = clouds[(i % 5) as usize];
        let region = format!("region-{}", (i / 5) % 40);
        let zone = format!("{region}-{}", (i / 200) % 4);
        let gpu = (i / 800) % (GPUS.len() as u64 + 3);
        let (accelerator, count, base) = match GPUS.get(gpu as usize) {
            Some((n, c, p)) => (Some((*n).into()), *c, *p),
            None => (None, 0.0, 0.1 * (gpu as f64)),
        };
        v.push(Offering {
            cloud: cloud.into(),
            instance_type: format!("{cloud}-t{}-{}", gpu, (i / 4000) % 30).into(),
            accelerator,
            accelerator_count: count,
            accelerator_memory_gib: None,
            vcpus: 8.0 * (1 + (i % 12)) as f32,
            memory_gib: 32.0 * (1 + (i % 12)) as f32,
            region: region.into(),
            zone: zone.into(),
            price: Some(base * jitter),
            spot_price: (!i.is_multiple_of(3)).then_some(base * jitter * 0.4),
            placement: true,
            efa: false,
            estimated: Default::default(),
        });
    }
    Catalog::from_offerings(v)
}

fn bench(c: &mut Criterion) {
    let catalog = generated(120_000);
    assert!(catalog.offerings().len() >= 100_000);
    let task = parse_str(
        "num_nodes: 4\nresources:\n  cpus: 16+\n  any_of:\n    - {accelerators: H100:8, use_spot: true}\n    - {accelerators: A100:8}\n    - {accelerators: H200:8, infra: aws}\n    - {accelerators: {L40S:4, A100-80GB:8}}\nrun: x\n",
        "bench.yaml",
    )
    .expect("valid task");
    let plan = optimize(&task, &catalog, &Blocklist::default(), &Options::default()).expect("plan");
    eprintln!(
        "catalog: {} offerings; plan: {} candidates",
        catalog.offerings().len(),
        plan.len()
    );
    c.bench_function("optimize 4-node any_of over 120k offerings", |b| {
        b.iter(|| optimize(&task, &catalog, &Blocklist::default(), &Options::default()).unwrap())
    });
    c.bench_function("load the embedded catalog", |b| b.iter(Catalog::embedded));
}

criterion_group!(benches, bench);
criterion_main!(benches);
