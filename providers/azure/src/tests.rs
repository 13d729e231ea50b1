use super::*;

fn req() -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName("train".into()),
        owner: "gw-0123456789abcdef".into(),
        placement: Placement {
            cloud: "azure".into(),
            region: "eastus".into(),
            zone: "eastus".into(),
        },
        instance_type: "Standard_ND96amsr_A100_v4".into(),
        count: 2,
        use_spot: true,
        accelerator: Some(("A100-80GB".into(), 8.0)),
        disk_size_gib: Some(256),
        image_id: None,
        client_token: "t".into(),
        provider_config: None,
        network_tier: None,
        max_price: None,
        ports: Vec::new(),
        labels: BTreeMap::new(),
    }
}

fn shape<'a>(r: &'a LaunchRequest, tags: &'a Tags) -> Shape<'a> {
    static OPTS: AzureOptions = AzureOptions {
        admin_user: None,
        ssh_user: None,
        accelerated_networking: None,
    };
    Shape {
        req: r,
        opts: &OPTS,
        tags,
        key: "k",
        ppg: None,
    }
}

fn provider(dir: &std::path::Path) -> AzureProvider {
    AzureProvider::new(dir.to_path_buf(), "gw-0123456789abcdef", dir.join("k.pub")).with_user("ann")
}

#[test]
fn a_spot_vm_is_spot_deleted_on_eviction_at_up_to_on_demand_price() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let r = req();
    let tags = p.tags(&r.cluster, &r.labels);
    let body = json(&p.vm_body(
        &Shape {
            req: &r,
            opts: &AzureOptions::default(),
            tags: &tags,
            key: "ssh-ed25519 AAAA k",
            ppg: Some("/ppg"),
        },
        "gw-train-0",
        "/nic",
    ));
    let props = &body["properties"];
    assert_eq!(props["priority"], "Spot");
    assert_eq!(props["evictionPolicy"], "Delete");
    assert_eq!(props["billingProfile"]["maxPrice"], -1.0);
    assert_eq!(props["proximityPlacementGroup"]["id"], "/ppg");
    assert_eq!(props["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(props["storageProfile"]["osDisk"]["diskSizeGB"], 256);
    assert_eq!(
        props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
        "Delete"
    );
    assert_eq!(
        props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"],
        "/home/gangway/.ssh/authorized_keys"
    );
    assert_eq!(
        props["storageProfile"]["imageReference"]["offer"],
        "ubuntu-hpc"
    );
    // Not zonal: no zones sent.
    assert!(body.get("zones").is_none(), "{body}");
    assert_eq!(body["tags"][TAG_CLUSTER], "train");
    assert_eq!(body["tags"][TAG_OWNER], "gw-0123456789abcdef");
    assert_eq!(body["tags"][TAG_USER], "ann");
    // Read-only properties are never sent.
    for ro in ["provisioningState", "vmId", "instanceView"] {
        assert!(props.get(ro).is_none(), "{ro}");
    }
}

#[test]
fn a_capped_price_is_the_max_price_and_regular_vms_have_no_spot_fields() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut r = req();
    r.max_price = Some(9.5);
    r.placement.zone = "eastus-2".into();
    let tags = p.tags(&r.cluster, &r.labels);
    let body = json(&p.vm_body(&shape(&r, &tags), "n", "/nic"));
    assert_eq!(body["properties"]["billingProfile"]["maxPrice"], 9.5);
    assert_eq!(body["zones"], serde_json::json!(["2"]));
    assert!(body["properties"].get("proximityPlacementGroup").is_none());
    r.use_spot = false;
    let body = json(&p.vm_body(&shape(&r, &tags), "n", "/nic"));
    assert_eq!(body["properties"]["priority"], "Regular");
    for spot_only in ["evictionPolicy", "billingProfile"] {
        assert!(body["properties"].get(spot_only).is_none(), "{spot_only}");
    }
}

#[test]
fn images_by_id_by_urn_and_by_default() {
    let mut r = req();
    r.image_id =
        Some("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i".into());
    assert!(matches!(image_of(&r), ImageReference::Id { .. }));
    r.image_id = Some("Canonical:ubuntu-24_04-lts:server:latest".into());
    assert_eq!(
        json(&image_of(&r)),
        serde_json::json!({"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"})
    );
    r.image_id = None;
    r.accelerator = None;
    assert_eq!(json(&image_of(&r))["publisher"], "Canonical");
}

#[test]
fn zones_from_placements() {
    let mut pl = req().placement;
    assert_eq!(zone_of(&pl), None);
    pl.zone = String::new();
    assert_eq!(zone_of(&pl), None);
    pl.zone = "eastus-3".into();
    assert_eq!(zone_of(&pl).as_deref(), Some("3"));
    pl.zone = "1".into();
    assert_eq!(zone_of(&pl).as_deref(), Some("1"));
}

#[test]
fn network_bodies_use_the_specifications_names() {
    let ip = json(&PublicIp {
        location: "eastus".into(),
        tags: Tags::new(),
        zones: None,
        sku: PublicIpSku {
            name: "Standard".into(),
            tier: "Regional".into(),
        },
        properties: PublicIpProperties {
            public_ip_allocation_method: "Static".into(),
            public_ip_address_version: "IPv4".into(),
        },
    });
    assert_eq!(ip["properties"]["publicIPAllocationMethod"], "Static");
    assert_eq!(ip["properties"]["publicIPAddressVersion"], "IPv4");
    let nic = json(&IpConfigurationProperties {
        subnet: SubResource { id: "/s".into() },
        public_ip_address: SubResource { id: "/ip".into() },
        private_ip_allocation_method: "Dynamic".into(),
        primary: true,
    });
    assert_eq!(nic["publicIPAddress"]["id"], "/ip");
    assert_eq!(nic["privateIPAllocationMethod"], "Dynamic");
}

#[test]
fn evicted_and_failed_vms_read_as_such() {
    let vm = |prio: &str, prov: &str, power: &str| {
        serde_json::json!({"properties": {"priority": prio, "provisioningState": prov,
            "instanceView": {"statuses": [{"code": format!("ProvisioningState/{}", prov.to_lowercase())},
                                          {"code": format!("PowerState/{power}")}]}}})
    };
    assert_eq!(
        state_of(&vm("Spot", "Succeeded", "running")),
        NodeState::Running
    );
    assert!(matches!(
        state_of(&vm("Spot", "Succeeded", "deallocated")),
        NodeState::Preempted { .. }
    ));
    assert_eq!(
        state_of(&vm("Regular", "Succeeded", "deallocated")),
        NodeState::Stopped
    );
    assert_eq!(
        state_of(&vm("Spot", "Failed", "stopped")),
        NodeState::Terminated
    );
    assert_eq!(
        state_of(&vm("Spot", "Creating", "starting")),
        NodeState::Pending
    );
}

#[test]
fn arm_errors_map_onto_the_contract_and_auth_names_the_identity() {
    let e = |code: &str, status| ArmError {
        status,
        code: code.into(),
        message: "m".into(),
    };
    let p = perr(
        e("ZonalAllocationFailed", 0),
        "azure/eastus/eastus",
        "creating VM x",
        "sp 1",
    );
    assert_eq!(p.kind, ErrorKind::Capacity);
    assert!(
        p.message.contains("creating VM x: ZonalAllocationFailed"),
        "{p}"
    );
    let p = perr(
        e("AuthorizationFailed", 403),
        "l",
        "creating VM x",
        "service principal abc",
    );
    assert_eq!(p.kind, ErrorKind::Auth);
    assert!(p.message.contains("service principal abc"), "{p}");
}

#[test]
fn group_names_are_per_cluster_location_and_owner() {
    let dir = tempfile::tempdir().unwrap();
    let a = provider(dir.path());
    let b = AzureProvider::new(
        dir.path().join("b"),
        "gw-fedcba9876543210",
        dir.path().join("k.pub"),
    );
    let c = ClusterName("train".into());
    assert!(a.group_name(&c, "eastus").starts_with("gw-train-eastus-"));
    assert_ne!(a.group_name(&c, "eastus"), b.group_name(&c, "eastus"));
    assert_ne!(a.group_name(&c, "eastus"), a.group_name(&c, "westus2"));
    // VM names: per rank, and never the same for two owners' clusters.
    let hash = a
        .group_name(&c, "eastus")
        .rsplit('-')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(a.vm_name(&c, 1), format!("gw-train-{hash}-1"));
    assert_ne!(a.vm_name(&c, 0), a.vm_name(&c, 1));
    assert_ne!(a.vm_name(&c, 0), b.vm_name(&c, 0));
}

#[test]
fn options_refuse_unknown_keys() {
    assert!(AzureOptions::from_value(Some(&serde_json::json!({"ssh_user": "root"}))).is_ok());
    assert!(AzureOptions::from_value(Some(&serde_json::json!({"sshuser": "root"}))).is_err());
}

#[test]
fn gpu_locations_are_those_where_a_gpu_size_is_not_restricted() {
    let sku = |name: &str, gpus: &str, locs: &[&str], restricted: &[&str]| {
        serde_json::json!({
            "resourceType": "virtualMachines", "name": name, "locations": locs,
            "capabilities": [{"name": "vCPUs", "value": "8"}, {"name": "GPUs", "value": gpus}],
            "restrictions": if restricted.is_empty() { serde_json::json!([]) } else {
                serde_json::json!([{"type": "Location", "values": restricted,
                                    "reasonCode": "NotAvailableForSubscription"}])
            },
        })
    };
    let skus = vec![
        sku("Standard_ND96amsr_A100_v4", "8", &["eastus"], &[]),
        sku(
            "Standard_NC4as_T4_v3",
            "1",
            &["WestEurope"],
            &["westeurope"],
        ),
        sku("Standard_D4s_v5", "0", &["northeurope"], &[]),
        serde_json::json!({"resourceType": "disks", "name": "Premium_LRS", "locations": ["japaneast"],
                           "capabilities": [{"name": "GPUs", "value": "1"}]}),
    ];
    assert_eq!(crate::gpu_locations(&skus), vec!["eastus".to_string()]);
}
