use std::time::{Duration, SystemTime};

use super::*;
use crate::core::catalog::{Catalog, Offering};
use crate::core::spec::parse_str;

#[allow(clippy::too_many_arguments)]
fn o(
    cloud: &str,
    it: &str,
    acc: Option<(&str, f32)>,
    vcpus: f32,
    region: &str,
    zone: &str,
    price: Option<f64>,
    spot: Option<f64>,
) -> Offering {
    Offering {
        cloud: cloud.into(),
        instance_type: it.into(),
        accelerator: acc.map(|a| a.0.into()),
        accelerator_count: acc.map_or(0.0, |a| a.1),
        accelerator_memory_gib: None,
        vcpus,
        memory_gib: vcpus * 4.0,
        region: region.into(),
        zone: zone.into(),
        price,
        spot_price: spot,
        placement: false,
        efa: false,
        estimated: Default::default(),
    }
}

fn catalog() -> Catalog {
    let mut c = Catalog::from_offerings(vec![
        o(
            "aws",
            "p5.48xlarge",
            Some(("H100", 8.0)),
            192.0,
            "us-east-1",
            "us-east-1a",
            Some(55.0),
            Some(20.0),
        ),
        o(
            "aws",
            "p5.48xlarge",
            Some(("H100", 8.0)),
            192.0,
            "us-east-1",
            "us-east-1b",
            Some(55.0),
            Some(18.0),
        ),
        o(
            "aws",
            "p5.48xlarge",
            Some(("H100", 8.0)),
            192.0,
            "us-west-2",
            "us-west-2a",
            Some(56.0),
            None,
        ),
        o(
            "aws",
            "p4d.24xlarge",
            Some(("A100", 8.0)),
            96.0,
            "us-east-1",
            "us-east-1a",
            Some(22.0),
            Some(9.0),
        ),
        o(
            "gcp",
            "a2-highgpu-8g",
            Some(("A100", 8.0)),
            96.0,
            "us-central1",
            "us-central1-a",
            Some(29.4),
            Some(11.0),
        ),
        o(
            "gcp",
            "a3-highgpu-8g",
            Some(("H100", 8.0)),
            208.0,
            "us-central1",
            "us-central1-a",
            Some(88.0),
            Some(30.0),
        ),
        o(
            "gcp",
            "a2-highgpu-1g",
            Some(("A100", 1.0)),
            12.0,
            "us-central1",
            "us-central1-a",
            Some(3.7),
            Some(1.2),
        ),
        o(
            "aws",
            "g5.xlarge",
            Some(("A10G", 1.0)),
            4.0,
            "us-east-1",
            "us-east-1a",
            Some(1.0),
            Some(0.4),
        ),
        o(
            "aws",
            "g5.2xlarge",
            Some(("A10G", 1.0)),
            8.0,
            "us-east-1",
            "us-east-1a",
            Some(1.2),
            Some(0.5),
        ),
        o(
            "aws",
            "g5.4xlarge",
            Some(("A10G", 1.0)),
            16.0,
            "us-east-1",
            "us-east-1a",
            Some(1.6),
            Some(0.7),
        ),
        o(
            "aws",
            "g5.8xlarge",
            Some(("A10G", 1.0)),
            32.0,
            "us-east-1",
            "us-east-1a",
            Some(2.4),
            Some(1.0),
        ),
        o(
            "aws",
            "m6i.large",
            None,
            2.0,
            "us-east-1",
            "us-east-1a",
            Some(0.096),
            Some(0.04),
        ),
        o(
            "aws",
            "m6i.2xlarge",
            None,
            8.0,
            "us-east-1",
            "us-east-1a",
            Some(0.384),
            Some(0.15),
        ),
        o(
            "local",
            "local.cpu",
            None,
            4.0,
            "local",
            "local-a",
            Some(0.01),
            Some(0.003),
        ),
        o(
            "local",
            "local.gpu8",
            Some(("*", 8.0)),
            32.0,
            "local",
            "local-a",
            Some(0.8),
            Some(0.24),
        ),
        o(
            "local",
            "local.gpu8",
            Some(("*", 8.0)),
            32.0,
            "local",
            "local-b",
            Some(0.8),
            Some(0.25),
        ),
    ]);
    // As the embedded catalog declares it.
    c.offer_only_when_named("local");
    c
}

fn plan_of(yaml: &str) -> Result<Vec<Candidate>, Infeasible> {
    let task = parse_str(yaml, "t.yaml").expect("valid task");
    optimize(
        &task,
        &catalog(),
        &Blocklist::default(),
        &Options::default(),
    )
}

/// `cloud/zone/type/spot total` per row: a compact golden form.
fn golden(plan: &[Candidate]) -> Vec<String> {
    plan.iter()
        .map(|c| {
            format!(
                "{}/{}/{}/{} {:.2}",
                c.cloud,
                c.zone,
                c.instance_type,
                if c.use_spot { "spot" } else { "od" },
                c.total_per_hour
            )
        })
        .collect()
}

#[test]
fn set_takes_the_cheapest_across_clouds_and_multiplies_by_nodes() {
    let p =
        plan_of("num_nodes: 4\nresources:\n  accelerators: {H100:8, A100:8}\nrun: x\n").unwrap();
    assert_eq!(
        golden(&p),
        vec![
            "aws/us-east-1a/p4d.24xlarge/od 88.00",
            "gcp/us-central1-a/a2-highgpu-8g/od 117.60",
            "aws/us-east-1a/p5.48xlarge/od 220.00",
            "aws/us-east-1b/p5.48xlarge/od 220.00",
            "aws/us-west-2a/p5.48xlarge/od 224.00",
            "gcp/us-central1-a/a3-highgpu-8g/od 352.00",
        ]
    );
    assert!(p.iter().all(|c| c.nodes == 4));
}

#[test]
fn ordered_list_keeps_the_users_order_over_price() {
    let p = plan_of("resources:\n  accelerators: [H100:8, A100:8]\nrun: x\n").unwrap();
    let first_a100 = p
        .iter()
        .position(|c| c.accelerator.as_deref() == Some("A100"))
        .unwrap();
    assert!(p[..first_a100]
        .iter()
        .all(|c| c.accelerator.as_deref() == Some("H100")));
    assert_eq!(p[0].instance_type, "p5.48xlarge");
    assert_eq!(p.len(), 6);
}

#[test]
fn ordered_resources_respect_order_and_any_of_mixes() {
    let ordered = plan_of(
        "resources:\n  ordered:\n    - {accelerators: H100:8, infra: gcp}\n    - {accelerators: A100:8}\nrun: x\n",
    )
    .unwrap();
    assert_eq!(ordered[0].instance_type, "a3-highgpu-8g");
    assert_eq!(ordered[1].instance_type, "p4d.24xlarge");
    let any = plan_of(
        "resources:\n  any_of:\n    - {accelerators: H100:8, infra: gcp}\n    - {accelerators: A100:8}\nrun: x\n",
    )
    .unwrap();
    assert_eq!(any[0].instance_type, "p4d.24xlarge");
    assert_eq!(any.last().unwrap().instance_type, "a3-highgpu-8g");
}

#[test]
fn fields_outside_any_of_are_defaults_for_each_item() {
    let p = plan_of(
        "resources:\n  use_spot: true\n  any_of:\n    - accelerators: A100:8\n    - {accelerators: H100:8, use_spot: false}\nrun: x\n",
    )
    .unwrap();
    assert!(p
        .iter()
        .filter(|c| c.accelerator.as_deref() == Some("A100"))
        .all(|c| c.use_spot));
    assert!(p
        .iter()
        .filter(|c| c.accelerator.as_deref() == Some("H100"))
        .all(|c| !c.use_spot));
    assert_eq!(p[0].price_per_node_hour, 9.0);
}

#[test]
fn spot_only_uses_zones_with_a_spot_price() {
    let p = plan_of("resources:\n  accelerators: H100:8\n  use_spot: true\nrun: x\n").unwrap();
    assert_eq!(
        golden(&p),
        vec![
            "aws/us-east-1b/p5.48xlarge/spot 18.00",
            "aws/us-east-1a/p5.48xlarge/spot 20.00",
            "gcp/us-central1-a/a3-highgpu-8g/spot 30.00",
        ]
    );
}

#[test]
fn pins_and_cpu_constraints_filter() {
    let p =
        plan_of("resources:\n  accelerators: H100:8\n  infra: aws/us-west-2\nrun: x\n").unwrap();
    assert_eq!(golden(&p), vec!["aws/us-west-2a/p5.48xlarge/od 56.00"]);
    let p = plan_of("resources:\n  accelerators: A10G\n  cpus: 8+\nrun: x\n").unwrap();
    assert_eq!(p[0].instance_type, "g5.2xlarge");
    let p = plan_of("resources:\n  accelerators: A10G\n  cpus: 16\nrun: x\n").unwrap();
    assert_eq!(golden(&p), vec!["aws/us-east-1a/g5.4xlarge/od 1.60"]);
    let p = plan_of("resources:\n  instance_type: g5.8xlarge\nrun: x\n").unwrap();
    assert_eq!(golden(&p), vec!["aws/us-east-1a/g5.8xlarge/od 2.40"]);
}

#[test]
fn keeps_n_types_per_region_with_all_their_zones() {
    let task = parse_str("resources:\n  accelerators: A10G\nrun: x\n", "t").unwrap();
    let opts = Options {
        types_per_region: 2,
        ..Options::default()
    };
    let p = optimize(&task, &catalog(), &Blocklist::default(), &opts).unwrap();
    assert_eq!(
        golden(&p),
        vec![
            "aws/us-east-1a/g5.xlarge/od 1.00",
            "aws/us-east-1a/g5.2xlarge/od 1.20"
        ]
    );
    let p = plan_of("resources:\n  accelerators: H100:8\nrun: x\n").unwrap();
    // Two zones of one type in us-east-1 both stay.
    assert_eq!(p.iter().filter(|c| c.region == "us-east-1").count(), 2);
}

#[test]
fn cpu_task_defaults_to_four_vcpus_and_never_uses_gpu_types() {
    let p = plan_of("run: x\n").unwrap();
    assert_eq!(p[0].instance_type, "m6i.2xlarge");
    assert!(p.iter().all(|c| c.accelerator.is_none()));
    let p = plan_of("resources:\n  cpus: 2\nrun: x\n").unwrap();
    assert_eq!(p[0].instance_type, "m6i.large");
}

#[test]
fn local_fake_gpus_only_when_pinned() {
    let p = plan_of("resources:\n  accelerators: A100:8\n  infra: local\nrun: x\n").unwrap();
    assert_eq!(
        golden(&p),
        vec![
            "local/local-a/local.gpu8/od 0.80",
            "local/local-b/local.gpu8/od 0.80"
        ]
    );
    assert_eq!(p[0].accelerator.as_deref(), Some("A100"));
    let p = plan_of("resources:\n  accelerators: A100:8\nrun: x\n").unwrap();
    assert!(p.iter().all(|c| c.cloud != "local"));
    let e = plan_of("resources:\n  accelerators: A100:3\n  infra: local\nrun: x\n").unwrap_err();
    assert_eq!(
        e.reasons,
        vec!["A100:3 is not offered; A100 comes with 8 per instance"]
    );
}

#[test]
fn blocklist_removes_until_expiry() {
    let task = parse_str(
        "resources:\n  accelerators: H100:8\n  use_spot: true\nrun: x\n",
        "t",
    )
    .unwrap();
    let now = SystemTime::now();
    let mut bl = Blocklist::default();
    bl.entries.push(Block {
        cloud: "aws".into(),
        region: Some("us-east-1".into()),
        zone: Some("us-east-1b".into()),
        instance_type: None,
        at_ms: 0,
        until: now + Duration::from_secs(600),
        reason: "capacity".into(),
    });
    let opts = Options {
        now,
        ..Options::default()
    };
    let p = optimize(&task, &catalog(), &bl, &opts).unwrap();
    assert_eq!(p[0].zone, "us-east-1a");
    let later = Options {
        now: now + Duration::from_secs(601),
        ..Options::default()
    };
    let p = optimize(&task, &catalog(), &bl, &later).unwrap();
    assert_eq!(p[0].zone, "us-east-1b");
    bl.entries.push(Block {
        cloud: "aws".into(),
        region: None,
        zone: None,
        instance_type: None,
        at_ms: 0,
        until: now + Duration::from_secs(600),
        reason: "quota exceeded on aws".into(),
    });
    bl.entries.push(Block {
        cloud: "gcp".into(),
        region: None,
        zone: None,
        instance_type: Some("a3-highgpu-8g".into()),
        at_ms: 0,
        until: now + Duration::from_secs(600),
        reason: "gcp out of capacity".into(),
    });
    let e = optimize(&task, &catalog(), &bl, &opts).unwrap_err();
    assert_eq!(
        e.reasons,
        vec!["all 3 matching H100:8 offerings are blocked for now (capacity; gcp out of capacity; quota exceeded on aws)"]
    );
}

#[test]
fn infeasible_says_which_constraint_removed_what() {
    let cases = [
        (
            "accelerators: H100:8\n  infra: '*/eu-north-1'",
            "H100:8 is offered only on aws, gcp; none of them in region eu-north-1",
        ),
        (
            "accelerators: H100:8\n  infra: aws/eu-north-1",
            "H100:8 on aws is not offered in region eu-north-1 (regions: us-east-1, us-west-2)",
        ),
        (
            "accelerators: H100:4",
            "H100:4 is not offered; H100 comes with 8 per instance",
        ),
        (
            "accelerators: H10:8",
            "no offering of accelerator 'H10' in the catalog; did you mean 'H100'?",
        ),
        (
            "accelerators: Z9:1",
            "no offering of accelerator 'Z9' in the catalog (known: A100, A10G, H100)",
        ),
        (
            "accelerators: A10G\n  cpus: 64+",
            "no A10G:1 offering has cpus 64+ (offered: 16, 32, 4, 8)",
        ),
        (
            "accelerators: H100:8\n  infra: aws/us-east-1/us-east-1c",
            "H100:8 is not offered in zone us-east-1c (zones: us-east-1a, us-east-1b)",
        ),
        (
            "accelerators: H100:8\n  infra: lambda",
            "H100 is offered only on aws, gcp; not on lambda",
        ),
        (
            "accelerators: H100:8\n  infra: aws/us-west-2\n  use_spot: true",
            "H100:8 has no spot price where the other constraints allow",
        ),
        (
            "accelerators: H100:8\n  max_hourly_cost: 10",
            "the cheapest H100:8 costs $55.00/h per node, above max_hourly_cost $10.00",
        ),
        (
            "instance_type: x9.huge",
            "instance type 'x9.huge' is not in the catalog",
        ),
    ];
    for (res, want) in cases {
        let e = plan_of(&format!("resources:\n  {res}\nrun: x\n")).unwrap_err();
        assert_eq!(e.reasons, vec![want.to_string()], "for {res}");
    }
}

#[test]
fn fractional_and_case_insensitive_names_match() {
    let p = plan_of("resources:\n  accelerators: a10g:1\nrun: x\n").unwrap();
    assert_eq!(p[0].accelerator.as_deref(), Some("A10G"));
}

#[test]
fn spot_risk_expected_cost_ranks_by_the_cost_of_useful_hours() {
    // The shipped catalog: AWS A100 spot offers carry the advisor's
    // buckets (p4d is ">20%" in us-east-1), GCP's the default.
    let catalog = Catalog::embedded();
    let plan = |risk: &str| {
        let yaml = format!(
            "resources:\n  accelerators: A100:8\n  use_spot: true\n  spot_risk: {risk}\nrun: x\n"
        );
        let task = parse_str(&yaml, "t.yaml").expect("valid task");
        optimize(&task, &catalog, &Blocklist::default(), &Options::default()).expect("a plan")
    };
    let by_price = plan("price");
    let by_risk = plan("{rank: expected_cost, restart_minutes: 10, checkpoint_minutes: 60}");
    let sorted = |v: Vec<f64>| v.windows(2).all(|w| w[0] <= w[1] + 1e-9);
    assert!(sorted(by_price.iter().map(|c| c.total_per_hour).collect()));
    let expected: Vec<f64> = by_risk
        .iter()
        .map(|c| {
            c.expected_cost_per_node_hour
                .expect("spot has an expected cost")
        })
        .collect();
    assert!(sorted(expected.clone()), "{expected:?}");
    // Every spot candidate says its bucket, and costs more than its price
    // once interruptions are counted.
    for c in &by_risk {
        assert!(c.interruption.is_some());
        assert!(c.expected_cost_per_node_hour.unwrap() > c.price_per_node_hour);
    }
    // The rankings differ: a riskier offer that is cheapest by price is
    // not first by expected cost.
    let key = |c: &Candidate| (c.cloud.clone(), c.zone.clone(), c.instance_type.clone());
    let a: Vec<_> = by_price.iter().map(key).collect();
    let b: Vec<_> = by_risk.iter().map(key).collect();
    assert_ne!(a, b);
    // The default stays price, as SkyPilot's.
    let task = parse_str(
        "resources:\n  accelerators: A100:8\n  use_spot: true\nrun: x\n",
        "t.yaml",
    )
    .unwrap();
    let default = optimize(&task, &catalog, &Blocklist::default(), &Options::default()).unwrap();
    assert_eq!(default.iter().map(key).collect::<Vec<_>>(), a);
}

#[test]
fn spot_risk_values_are_checked() {
    for (yaml, want) in [
        ("spot_risk: cheapest", "unknown spot_risk 'cheapest'"),
        (
            "spot_risk: {rank: price, restart: 5}",
            "unknown field 'restart'",
        ),
        (
            "spot_risk: {restart_minutes: -1}",
            "expected minutes at or above 0",
        ),
    ] {
        let text = format!("resources:\n  {yaml}\nrun: x\n");
        let e = parse_str(&text, "t.yaml").unwrap_err().to_string();
        assert!(e.contains(want), "{yaml}: {e}");
    }
}
