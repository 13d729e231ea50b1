//! `infra: aws` end to end through the real binary, against the EC2
//! emulator (moto plus gangway's fault layer). Instances there are not
//! machines, so launches stop after provisioning (`--provision-only`); the
//! SSH steps are covered by the ssh suites.

use std::process::Output;

use crate::ec2_emulator::Ec2Emulator;
use serde_json::Value;

use crate::common::{command_in, json_doc, parts, Running, TestHome};

/// A home whose gangway talks to the emulator: an installation of its
/// own (its owner id, so sweeps never take other tests' clusters), with a
/// user name of its own.
struct Aws {
    home: TestHome,
    emu: &'static Ec2Emulator,
    /// `$USER`: the readable `gangway-user` tag (and the owner tag of
    /// earlier versions).
    owner: String,
}

impl Aws {
    fn new() -> Option<Aws> {
        let emu = Ec2Emulator::shared()?;
        let home = TestHome::new();
        let owner = format!("it-{}", home.marker);
        Some(Aws { home, emu, owner })
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut c = command_in(self.home.path());
        c.envs(self.emu.env())
            // No test asks AWS's own Spot Advisor feed: a closed port.
            .env("GANGWAY_SPOT_ADVISOR_URL", "http://127.0.0.1:9/feed.json")
            .env("USER", &self.owner)
            .env("GANGWAY_AWS_SSH_CIDR", "198.51.100.0/24")
            .args(args);
        Running::start(c).wait()
    }

    /// A task on AWS with the emulator's images.
    fn task(&self, name: &str, infra: &str, nodes: u32) -> String {
        self.home.file(
            &format!("{name}.yaml"),
            &format!(
                "name: {name}\nnum_nodes: {nodes}\nresources:\n  infra: {infra}\n  accelerators: A100:8\n  use_spot: true\n\
                 run: echo hi\nconfig:\n  aws:\n    ami_name: 'Deep Learning AMI Ubuntu*'\n    ami_owner: '898082745236'\n    poll_ms: 20\n    boot_timeout_s: 30\n"
            ),
        )
    }

    fn launch(&self, cluster: &str, task: &str) -> (i32, String, String) {
        parts(&self.run(&["launch", "--provision-only", "-y", "-c", cluster, task]))
    }

    fn status(&self, cluster: &str) -> Value {
        let (code, out, err) = parts(&self.run(&["status", cluster, "-o", "json"]));
        assert_eq!(code, 0, "{err}");
        json_doc(&out)["clusters"][0].clone()
    }

    /// This installation's owner id (made by its first command).
    fn id(&self) -> String {
        let path = self.home.path().join("owner");
        if !path.exists() {
            let (code, out, err) = parts(&self.run(&["check", "aws", "-o", "json"]));
            assert_eq!(code, 0, "{out}\n{err}");
        }
        std::fs::read_to_string(&path)
            .expect("the owner id file")
            .trim()
            .to_string()
    }

    /// Independent count of what EC2 holds for the cluster, by tag.
    fn left(&self, cluster: &str) -> Vec<String> {
        self.left_of(cluster, &self.id())
    }

    /// The same, for resources tagged with this owner.
    fn left_of(&self, cluster: &str, owner: &str) -> Vec<String> {
        tagged_resources(self.emu, cluster, owner)
    }
}

/// What EC2 holds for the cluster of `owner`, counted by tag without
/// gangway: instances not terminated, security groups, placement groups
/// and key pairs, as `REGION ACTION ID`, in the regions tests launch in.
pub(crate) fn tagged_resources(emu: &Ec2Emulator, cluster: &str, owner: &str) -> Vec<String> {
    let regions = [
        "us-east-1",
        "us-west-2",
        "eu-west-1",
        "us-east-2",
        "eu-central-1",
    ];
    tagged_resources_in(emu, cluster, owner, &regions)
}

/// [`tagged_resources`] in `regions`.
pub(crate) fn tagged_resources_in(
    emu: &Ec2Emulator,
    cluster: &str,
    owner: &str,
    regions: &[impl AsRef<str>],
) -> Vec<String> {
    let mut found = Vec::new();
    for region in regions.iter().map(AsRef::as_ref) {
        for (action, item) in [
            ("DescribeInstances", "instanceId"),
            ("DescribeSecurityGroups", "groupId"),
            ("DescribePlacementGroups", "groupName"),
            ("DescribeKeyPairs", "keyName"),
        ] {
            let mut params = vec![
                ("Action", action),
                ("Filter.1.Name", "tag:gangway-cluster"),
                ("Filter.1.Value.1", cluster),
                ("Filter.2.Name", "tag:gangway-owner"),
                ("Filter.2.Value.1", owner),
            ];
            if action == "DescribeInstances" {
                params.extend([
                    ("Filter.3.Name", "instance-state-name"),
                    ("Filter.3.Value.1", "pending"),
                    ("Filter.3.Value.2", "running"),
                    ("Filter.3.Value.3", "stopped"),
                ]);
            }
            let (s, xml) = emu.call(region, &params);
            assert_eq!(s, 200, "{action}: {xml}");
            let open = format!("<{item}>");
            for piece in xml.split(&open).skip(1) {
                let v = piece.split('<').next().unwrap_or_default();
                if action != "DescribeInstances" || v.starts_with("i-") {
                    found.push(format!("{region} {action} {v}"));
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn a_stockout_fails_over_to_the_next_zone_and_down_leaves_nothing() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.task("stockout", "aws/us-east-1", 2);
    aws.emu.inject(
        "RunInstances",
        &["gw-stockout"],
        "InsufficientInstanceCapacity",
        "",
        1,
    );
    let (code, out, err) = aws.launch("gw-stockout", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("InsufficientInstanceCapacity"),
        "the failed attempt is shown: {all}"
    );
    assert_eq!(
        aws.emu
            .fired("RunInstances", "InsufficientInstanceCapacity"),
        1
    );

    let c = aws.status("gw-stockout");
    assert_eq!(c["status"], "UP", "{c}");
    assert_eq!(c["cloud"], "aws");
    assert_eq!(c["region"], "us-east-1");
    // The cheapest zone failed, so the cluster is in another one.
    let plan = parts(&aws.run(&["optimize", &task, "-o", "json"])).1;
    let first = json_doc(&plan)["plan"][0]["zone"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!first.is_empty(), "plan: {plan}");
    assert_ne!(c["zone"].as_str(), Some(first.as_str()), "{c}");
    let nodes = c["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2);
    let instances: Vec<_> = aws
        .left("gw-stockout")
        .into_iter()
        .filter(|l| l.contains("DescribeInstances"))
        .collect();
    assert_eq!(
        instances.len(),
        2,
        "no leftovers of the failed attempt: {instances:?}"
    );

    let (code, out, err) = parts(&aws.run(&["down", "-y", "gw-stockout"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(aws.left("gw-stockout"), Vec::<String>::new());
    assert!(aws.home.cluster_opt("gw-stockout").is_none());
}

#[test]
fn throttling_is_retried_with_backoff() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.task("throttle", "aws/us-east-1", 1);
    aws.emu.inject(
        "RunInstances",
        &["gw-throttle"],
        "RequestLimitExceeded",
        "Request limit exceeded.",
        2,
    );
    let (code, out, err) = aws.launch("gw-throttle", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(aws.emu.fired("RunInstances", "RequestLimitExceeded"), 2);
    let c = aws.status("gw-throttle");
    assert_eq!(c["status"], "UP");
    // Retried in place: the first candidate's zone, not a failover.
    let plan = parts(&aws.run(&["optimize", &task, "-o", "json"])).1;
    assert_eq!(c["zone"], json_doc(&plan)["plan"][0]["zone"], "{c}");
    assert_eq!(parts(&aws.run(&["down", "-y", "gw-throttle"])).0, 0);
    assert_eq!(aws.left("gw-throttle"), Vec::<String>::new());
}

#[test]
fn a_quota_blocks_the_region_and_the_launch_moves_on() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.task("quota", "aws", 1);
    let plan = parts(&aws.run(&["optimize", &task, "-o", "json"])).1;
    let first = json_doc(&plan)["plan"][0]["region"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    aws.emu
        .inject("RunInstances", &["gw-quota"], "VcpuLimitExceeded", "", 1);
    let (code, out, err) = aws.launch("gw-quota", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let c = aws.status("gw-quota");
    assert_ne!(
        c["region"].as_str(),
        Some(first.as_str()),
        "moved off {first}: {c}"
    );
    assert_eq!(parts(&aws.run(&["down", "-y", "gw-quota"])).0, 0);
    assert_eq!(aws.left("gw-quota"), Vec::<String>::new());
}

#[test]
fn refused_credentials_stop_the_launch_and_leave_nothing() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.task("denied", "aws/us-east-1", 2);
    aws.emu.inject(
        "RunInstances",
        &["gw-denied"],
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        1,
    );
    let (code, out, err) = aws.launch("gw-denied", &task);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("aws") && err.contains("UnauthorizedOperation"),
        "{err}"
    );
    assert!(err.contains("us-east-1"), "names the region: {err}");
    assert!(!err.contains("testing"), "no credentials in errors: {err}");
    assert!(aws.home.cluster_opt("gw-denied").is_none());
    assert_eq!(aws.left("gw-denied"), Vec::<String>::new());
}

#[test]
fn check_names_the_identity_and_regions() {
    let Some(aws) = Aws::new() else { return };
    let (code, out, err) = parts(&aws.run(&["check", "aws", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let v = json_doc(&out);
    let c = &v["clouds"][0];
    assert_eq!(c["cloud"], "aws");
    assert_eq!(c["ok"], true);
    assert!(
        c["identity"]
            .as_str()
            .is_some_and(|i| i.starts_with("arn:aws")),
        "{c}"
    );
    assert!(c["regions"]
        .as_array()
        .is_some_and(|r| r.iter().any(|x| x == "us-east-1")));
    // An unknown cloud is a usage error naming the known ones.
    let (code, _, err) = parts(&aws.run(&["check", "oracle"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("aws") && err.contains("local"), "{err}");
}

/// `catalog refresh` of AWS's us-east-1.
const REFRESH_US_EAST_1: &[&str] = &[
    "catalog",
    "refresh",
    "--cloud",
    "aws",
    "--regions",
    "us-east-1",
];

/// The overlay's p4d.24xlarge rows in us-east-1.
/// A spot cluster's ledger row is priced at what EC2 said the zone's spot
/// market asked when the nodes came up, not the plan's (catalog) price;
/// cost-report says where each price came from.
#[test]
fn a_spot_clusters_cost_is_the_zones_market_price_at_launch() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.task("priced", "aws/us-east-1", 2);
    let (code, out, err) = aws.launch("gw-priced", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let c = aws.status("gw-priced");
    let zone = c["zone"].as_str().expect("zone").to_string();
    let itype = c["instance_type"].as_str().expect("type").to_string();
    let (_, xml) = aws.emu.call(
        "us-east-1",
        &[
            ("Action", "DescribeSpotPriceHistory"),
            ("InstanceType.1", itype.as_str()),
            ("AvailabilityZone", zone.as_str()),
            ("ProductDescription.1", "Linux/UNIX"),
        ],
    );
    let field = |item: &str, name: &str| -> Option<String> {
        Some(
            item.split(&format!("<{name}>"))
                .nth(1)?
                .split('<')
                .next()?
                .to_string(),
        )
    };
    let market: f64 = xml
        .split("<item>")
        .filter(|i| field(i, "availabilityZone").as_deref() == Some(zone.as_str()))
        .filter_map(|i| field(i, "spotPrice")?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no spot price for {itype} in {zone}: {xml}"));
    let (code, out, err) = parts(&aws.run(&["cost-report", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let report = json_doc(&out);
    let row = report["clusters"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "gw-priced"))
        .map(|c| c["rows"][0].clone())
        .unwrap_or_else(|| panic!("no ledger row: {report}"));
    assert_eq!(row["price_source"], "provider", "{row}");
    let priced = row["price_per_hour"].as_f64().expect("price");
    assert!(
        (priced - 2.0 * market).abs() < 1e-6,
        "2 nodes at the market's {market}/h, ledger says {priced}: {row}"
    );
    assert_eq!(report["price_sources"]["provider"], 1, "{report}");
    let plan = c["price_per_hour"].as_f64().unwrap_or_default();
    assert!(
        (plan - priced).abs() > 1e-6,
        "the plan's price ({plan}) is not what the market asked ({priced})"
    );
    let (code, table, _) = parts(&aws.run(&["cost-report"]));
    assert_eq!(code, 0);
    assert!(
        table.contains("at the prices the providers reported at launch"),
        "{table}"
    );
    let (code, out, err) = parts(&aws.run(&["down", "-y", "gw-priced"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(aws.left("gw-priced"), Vec::<String>::new());
}

fn p4d_in_us_east_1(csv: &str) -> Vec<&str> {
    csv.lines()
        .filter(|l| l.starts_with("p4d.24xlarge,") && l.contains(",us-east-1,"))
        .collect()
}

#[test]
fn catalog_refresh_writes_live_spot_prices_into_the_users_overlay() {
    let Some(aws) = Aws::new() else { return };
    let (code, out, err) = parts(&aws.run(REFRESH_US_EAST_1));
    assert_eq!(code, 0, "{out}\n{err}");
    let path = aws.home.path().join("catalog/aws.csv");
    let text = std::fs::read_to_string(&path).expect("overlay written");
    // The emulator's spot price for p4d in us-east-1 is what the file holds.
    let (_, xml) = aws.emu.call(
        "us-east-1",
        &[
            ("Action", "DescribeSpotPriceHistory"),
            ("InstanceType.1", "p4d.24xlarge"),
            ("ProductDescription.1", "Linux/UNIX"),
        ],
    );
    let price: f64 = xml
        .split("<spotPrice>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .and_then(|s| s.parse().ok())
        .expect("emulator spot price");
    let p4d = p4d_in_us_east_1(&text);
    assert!(!p4d.is_empty(), "{text}");
    // On-demand: the Price List API's, the same in every zone.
    let on_demand = aws.emu.on_demand_price("p4d.24xlarge", "us-east-1");
    for l in &p4d {
        let spot: f64 = l.split(',').nth(9).unwrap().parse().expect("spot price");
        assert_eq!(spot, price, "{l}");
        let od: f64 = l
            .split(',')
            .nth(8)
            .unwrap()
            .parse()
            .expect("on-demand price");
        assert_eq!(od, on_demand, "{l}");
        // Both prices are the provider's own now: not marked estimated.
        assert!(l.ends_with(','), "the estimated column is empty: {l}");
    }
    // Other regions keep the shipped prices; `catalog show` names the overlay.
    assert!(text.contains(",us-west-2,"), "other regions kept");
    let (code, out, _) = parts(&aws.run(&["catalog", "show", "-o", "json"]));
    assert_eq!(code, 0);
    let v = json_doc(&out);
    let src = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["cloud"] == "aws")
        .cloned()
        .unwrap();
    assert!(
        src["origin"].as_str().unwrap().ends_with("catalog/aws.csv"),
        "{src}"
    );
    assert_eq!(src["age_days"], 0, "{src}");
}

/// Serves `body` as JSON to every GET on a loopback port, on a thread, for
/// the life of the test; its URL.
fn serve_json(body: String) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/spot-advisor-data.json", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut conn in l.incoming().flatten() {
            use std::io::{Read, Write};
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// The Spot Instance Advisor's buckets come with the refresh: a feed
/// saying p4d.24xlarge in us-east-1 is now `<5%` (shipped: `>20%`) turns
/// into the bucket `optimize` shows and ranks by.
#[test]
fn catalog_refresh_takes_the_spot_advisors_buckets_over_the_shipped_ones() {
    let Some(aws) = Aws::new() else { return };
    let task = aws.home.file(
        "p4d.yaml",
        "resources:\n  infra: aws/us-east-1\n  accelerators: A100:8\n  use_spot: true\nrun: 'true'\n",
    );
    let bucket = |aws: &Aws| {
        let (code, out, err) = parts(&aws.run(&["optimize", &task, "-o", "json"]));
        assert_eq!(code, 0, "{out}\n{err}");
        let v = json_doc(&out);
        let c = v["plan"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .find(|c| c["instance_type"] == "p4d.24xlarge")
            .cloned()
            .unwrap_or_else(|| panic!("no p4d: {v}"));
        c["interruption"].as_str().unwrap().to_string()
    };
    assert_eq!(bucket(&aws), ">20%", "the shipped bucket");
    let feed = serde_json::json!({
        "ranges": [{"index": 0, "label": "<5%", "dots": 0, "max": 5}],
        "spot_advisor": {"us-east-1": {
            "Linux": {"p4d.24xlarge": {"s": 70, "r": 0}, "g5.xlarge": {"s": 60, "r": 3}},
            "Windows": {"p4d.24xlarge": {"s": 70, "r": 4}}}},
    });
    let mut c = command_in(aws.home.path());
    c.envs(aws.emu.env())
        .env("GANGWAY_SPOT_ADVISOR_URL", serve_json(feed.to_string()))
        .args(REFRESH_US_EAST_1);
    let (code, out, err) = parts(&Running::start(c).wait());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("aws: 2 interruption bucket(s)"), "{out}");
    assert_eq!(bucket(&aws), "<5%", "the feed's bucket");
    // Without the feed (a closed port), the refresh says so and the
    // buckets fetched before stay.
    let (code, out, err) = parts(&aws.run(REFRESH_US_EAST_1));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("interruption buckets not refreshed"), "{out}");
    assert_eq!(bucket(&aws), "<5%");
}

/// Credentials that may not read the Price List API: the refresh still
/// writes the spot prices, keeps the catalog's on-demand ones, and says
/// why in a note naming the API and what it answered.
#[test]
fn catalog_refresh_without_pricing_access_keeps_on_demand_prices_and_says_why() {
    let Some(aws) = Aws::new() else { return };
    let key = format!("AKIANOPRICE{}", std::process::id());
    let rule = aws.emu.inject(
        "GetProducts",
        &[&key],
        "AccessDeniedException",
        "User is not authorized to perform: pricing:GetProducts",
        -1,
    );
    let mut c = crate::common::command_in(aws.home.path());
    c.envs(aws.emu.env_as(&key)).args(REFRESH_US_EAST_1);
    let (code, out, err) = parts(&crate::common::Running::start(c).wait());
    aws.emu.remove_fault(rule);
    assert_eq!(code, 0, "{out}\n{err}");
    let said = format!("{out}{err}");
    assert!(
        said.contains("on-demand prices not refreshed")
            && said.contains("pricing:GetProducts")
            && said.contains("AccessDeniedException"),
        "{said}"
    );
    let text = std::fs::read_to_string(aws.home.path().join("catalog/aws.csv")).unwrap();
    let on_demand = aws.emu.on_demand_price("p4d.24xlarge", "us-east-1");
    let p4d = p4d_in_us_east_1(&text);
    assert!(!p4d.is_empty(), "{text}");
    for l in &p4d {
        let od: f64 = l.split(',').nth(8).unwrap().parse().unwrap();
        assert_ne!(
            od, on_demand,
            "the emulator's price came through anyway: {l}"
        );
        assert!(
            !l.split(',').nth(9).unwrap().is_empty(),
            "spot written: {l}"
        );
    }
}

/// The value of `key` among the tags of the first resource in an EC2
/// answer.
fn tag_in(xml: &str, key: &str) -> Option<String> {
    let at = xml.find(&format!("<key>{key}</key>"))?;
    let rest = &xml[at..];
    let v = rest.split("<value>").nth(1)?.split("</value>").next()?;
    Some(v.to_string())
}

#[test]
fn down_orphans_sweeps_only_this_installations_clusters() {
    let Some(a) = Aws::new() else { return };
    // Another installation on the same account, logged in as the same user.
    let b = Aws {
        home: TestHome::new(),
        emu: a.emu,
        owner: a.owner.clone(),
    };
    let task = a.task("orphan", "aws/us-east-1", 1);
    let (code, out, err) = a.launch("gw-orph-a", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = b.launch("gw-orph-b", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let (ida, idb) = (a.id(), b.id());
    assert!(ida.starts_with("gw-") && ida.len() == 19, "{ida}");
    assert_ne!(ida, idb, "each installation has an id of its own");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(a.home.path().join("owner"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    // Both tags on what gangway made: the id, and the readable user.
    let (_, xml) = a.emu.call(
        "us-east-1",
        &[
            ("Action", "DescribeSecurityGroups"),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", "gw-orph-a"),
        ],
    );
    assert_eq!(tag_in(&xml, "gangway-owner"), Some(ida.clone()), "{xml}");
    assert_eq!(tag_in(&xml, "gangway-user"), Some(a.owner.clone()), "{xml}");
    // `check` says what the id is.
    let (_, out, _) = parts(&a.run(&["check", "aws"]));
    assert!(out.contains(&ida), "{out}");

    // A loses its state and sweeps: only its own cluster goes.
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(a.home.path().join(f));
    }
    let (code, out, err) = parts(&a.run(&["down", "--orphans", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("gw-orph-a"), "{out}");
    assert!(!out.contains("gw-orph-b"), "another installation's: {out}");
    assert!(
        out.contains("of other gangway installations seen, not touched"),
        "{out}"
    );
    assert_eq!(a.left("gw-orph-a"), Vec::<String>::new());
    assert!(!b.left("gw-orph-b").is_empty(), "B's cluster was taken");
    assert_eq!(b.status("gw-orph-b")["status"], "UP");

    // B adopts what A leaves, by A's id.
    let (code, out, err) = a.launch("gw-orph-a2", &task);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = parts(&b.run(&["down", "--orphans", "--owner", &ida, "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("Terminated orphaned cluster 'gw-orph-a2'"),
        "{out}"
    );
    assert_eq!(a.left("gw-orph-a2"), Vec::<String>::new());
    assert!(!b.left("gw-orph-b").is_empty(), "B's own cluster stays");
    let (code, out, err) = parts(&b.run(&["down", "-y", "gw-orph-b"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(b.left("gw-orph-b"), Vec::<String>::new());
    // A's record of the first one: its down finds nothing left.
    let (code, _, err) = parts(&a.run(&["down", "-y", "gw-orph-a2"]));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_cluster_tagged_by_an_earlier_version_is_listed_not_deleted() {
    let Some(aws) = Aws::new() else { return };
    // What an earlier version made: the user's name as owner tag.
    let cluster = format!("gw-old-{}", aws.home.marker);
    let (status, xml) = aws.emu.call(
        "us-east-1",
        &[
            ("Action", "CreateSecurityGroup"),
            ("GroupName", &format!("gangway-{cluster}-0")),
            ("GroupDescription", "gangway cluster before owner ids"),
            ("TagSpecification.1.ResourceType", "security-group"),
            ("TagSpecification.1.Tag.1.Key", "gangway-cluster"),
            ("TagSpecification.1.Tag.1.Value", &cluster),
            ("TagSpecification.1.Tag.2.Key", "gangway-owner"),
            ("TagSpecification.1.Tag.2.Value", &aws.owner),
        ],
    );
    assert_eq!(status, 200, "{xml}");
    let (code, out, err) = parts(&aws.run(&["down", "--orphans", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&cluster)
            && out.contains(&format!("gangway down --orphans --owner {}", aws.owner)),
        "listed with the command that adopts it: {out}"
    );
    assert_eq!(aws.left_of(&cluster, &aws.owner).len(), 1, "deleted: {out}");
    // JSON says the same.
    let (code, out, _) = parts(&aws.run(&["down", "--orphans", "-y", "-o", "json"]));
    assert_eq!(code, 0);
    let v = json_doc(&out);
    assert!(
        v["earlier_versions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["cluster"] == cluster.as_str() && c["owner"] == aws.owner.as_str()),
        "{v}"
    );
    assert_eq!(v["owner"], aws.id().as_str());
    // Adopted explicitly, it goes.
    let (code, out, err) = parts(&aws.run(&["down", "--orphans", "--owner", &aws.owner, "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!("Terminated orphaned cluster '{cluster}'")),
        "{out}"
    );
    assert_eq!(aws.left_of(&cluster, &aws.owner), Vec::<String>::new());
}

#[test]
fn commands_racing_on_a_fresh_home_agree_on_one_owner_id() {
    let Some(aws) = Aws::new() else { return };
    let runs: Vec<std::thread::JoinHandle<Output>> = (0..8)
        .map(|_| {
            let mut c = command_in(aws.home.path());
            c.envs(aws.emu.env())
                .env("USER", &aws.owner)
                .args(["check", "aws", "-o", "json"]);
            std::thread::spawn(move || Running::start(c).wait())
        })
        .collect();
    let ids: Vec<String> = runs
        .into_iter()
        .map(|r| {
            let (code, out, err) = parts(&r.join().unwrap());
            assert_eq!(code, 0, "{out}\n{err}");
            json_doc(&out)["owner"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let id = aws.id();
    assert!(ids.iter().all(|i| *i == id), "{ids:?} vs {id}");
    // Only the id is left in the home: no temporary files.
    let names = crate::common::dir_names(aws.home.path());
    assert!(!names.iter().any(|n| n.contains(".owner.")), "{names:?}");
}

/// `docs/aws.md`'s first command, on the example file as shipped: two
/// spot 8xA100 nodes on the default Deep Learning AMI in one placement
/// group, and `down` removes all of it.
#[test]
fn the_documented_example_provisions_as_shipped_and_down_leaves_nothing() {
    let Some(aws) = Aws::new() else { return };
    let example = crate::common::root().join("examples/aws-a100.yaml");
    let example = example.to_str().expect("utf-8 path");
    // What docs/aws.md runs, less the run itself (no machines here).
    let (code, out, err) = aws.launch("gw-example", example);
    assert_eq!(code, 0, "{out}\n{err}");
    let c = aws.status("gw-example");
    assert_eq!(c["status"], "UP", "{c}");
    assert_eq!(c["cloud"], "aws", "{c}");
    let left = aws.left("gw-example");
    let instances: Vec<&String> = left
        .iter()
        .filter(|l| l.contains("DescribeInstances"))
        .collect();
    assert_eq!(instances.len(), 2, "{left:?}");
    assert_eq!(
        left.iter()
            .filter(|l| l.contains("DescribePlacementGroups"))
            .count(),
        1,
        "{left:?}"
    );
    let region = instances[0].split(' ').next().expect("region");
    let id = instances[0].rsplit(' ').next().expect("id");
    let (s, xml) = aws.emu.call(
        region,
        &[("Action", "DescribeInstances"), ("InstanceId.1", id)],
    );
    assert_eq!(s, 200, "{xml}");
    for (tag, want) in [
        ("instanceType", "p4d.24xlarge"),
        ("imageId", "ami-0d1a0b1e2c3d4e5f6"),
        ("instanceLifecycle", "spot"),
    ] {
        let got = xml
            .split(&format!("<{tag}>"))
            .nth(1)
            .and_then(|r| r.split('<').next());
        assert_eq!(got, Some(want), "{tag} in {xml}");
    }
    let (code, out, err) = parts(&aws.run(&["down", "-y", "gw-example"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(aws.left("gw-example"), Vec::<String>::new());
}
