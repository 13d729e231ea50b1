//! The ARM request bodies a launch sends, typed from the OpenAPI models of
//! the API versions in [`crate::arm`] (`Microsoft.Compute` 2024-11-01,
//! `Microsoft.Network` 2024-10-01, `Microsoft.Resources` 2025-03-01): the
//! fields gangway sets, with their JSON names and the `properties`
//! envelope. Read-only properties are never sent; answers are read as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

/// Tags on every resource.
pub type Tags = BTreeMap<String, String>;

/// `{"id": ...}`: a reference to another resource.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SubResource {
    /// Its ARM id.
    pub id: String,
}

/// `ResourceGroup`.
#[derive(Debug, Serialize)]
pub struct ResourceGroup {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
}

/// `NetworkSecurityGroup`.
#[derive(Debug, Serialize)]
pub struct NetworkSecurityGroup {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// Its rules.
    pub properties: NsgProperties,
}

/// `NetworkSecurityGroupPropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NsgProperties {
    /// Inline rules.
    pub security_rules: Vec<SecurityRule>,
}

/// `SecurityRule` (inline in its group).
#[derive(Debug, Serialize)]
pub struct SecurityRule {
    /// Rule name.
    pub name: String,
    /// What it admits.
    pub properties: SecurityRuleProperties,
}

/// `SecurityRulePropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityRuleProperties {
    /// `Tcp`.
    pub protocol: String,
    /// `Allow`.
    pub access: String,
    /// `Inbound`.
    pub direction: String,
    /// 100-4096, unique per direction.
    pub priority: i32,
    /// Source CIDR.
    pub source_address_prefix: String,
    /// `*`.
    pub source_port_range: String,
    /// `*`.
    pub destination_address_prefix: String,
    /// `22`, or `8000-8010`.
    pub destination_port_range: String,
}

/// `VirtualNetwork` with its subnet inline.
#[derive(Debug, Serialize)]
pub struct VirtualNetwork {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// Address space and subnets.
    pub properties: VnetProperties,
}

/// `VirtualNetworkPropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VnetProperties {
    /// The network's prefixes.
    pub address_space: AddressSpace,
    /// Its subnets.
    pub subnets: Vec<Subnet>,
}

/// `AddressSpace`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressSpace {
    /// CIDRs.
    pub address_prefixes: Vec<String>,
}

/// `Subnet` (inline in its network).
#[derive(Debug, Serialize)]
pub struct Subnet {
    /// Name.
    pub name: String,
    /// Prefix and group.
    pub properties: SubnetProperties,
}

/// `SubnetPropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubnetProperties {
    /// CIDR.
    pub address_prefix: String,
    /// The NSG every NIC in it is behind.
    pub network_security_group: SubResource,
}

/// `PublicIPAddress`.
#[derive(Debug, Serialize)]
pub struct PublicIp {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// The VM's zone, if zonal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// `Standard`, `Regional`.
    pub sku: PublicIpSku,
    /// Static IPv4.
    pub properties: PublicIpProperties,
}

/// `PublicIPAddressSku`.
#[derive(Debug, Serialize)]
pub struct PublicIpSku {
    /// `Standard`.
    pub name: String,
    /// `Regional`.
    pub tier: String,
}

/// `PublicIPAddressPropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpProperties {
    /// `Static` (Standard addresses must be).
    #[serde(rename = "publicIPAllocationMethod")]
    pub public_ip_allocation_method: String,
    /// `IPv4`.
    #[serde(rename = "publicIPAddressVersion")]
    pub public_ip_address_version: String,
}

/// `NetworkInterface`.
#[derive(Debug, Serialize)]
pub struct NetworkInterface {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// Its IP configuration.
    pub properties: NicProperties,
}

/// `NetworkInterfacePropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NicProperties {
    /// Where the size supports it.
    pub enable_accelerated_networking: bool,
    /// The one configuration.
    pub ip_configurations: Vec<IpConfiguration>,
}

/// `NetworkInterfaceIPConfiguration`.
#[derive(Debug, Serialize)]
pub struct IpConfiguration {
    /// Name.
    pub name: String,
    /// Subnet and public address.
    pub properties: IpConfigurationProperties,
}

/// `NetworkInterfaceIPConfigurationPropertiesFormat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfigurationProperties {
    /// The subnet.
    pub subnet: SubResource,
    /// The public address.
    #[serde(rename = "publicIPAddress")]
    pub public_ip_address: SubResource,
    /// `Dynamic`.
    #[serde(rename = "privateIPAllocationMethod")]
    pub private_ip_allocation_method: String,
    /// The NIC's primary configuration.
    pub primary: bool,
}

/// `ProximityPlacementGroup`.
#[derive(Debug, Serialize)]
pub struct ProximityPlacementGroup {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// `Standard`.
    pub properties: PpgProperties,
}

/// `ProximityPlacementGroupProperties`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PpgProperties {
    /// `Standard`.
    pub proximity_placement_group_type: String,
}

/// `VirtualMachine`.
#[derive(Debug, Serialize)]
pub struct VirtualMachine {
    /// Location.
    pub location: String,
    /// Tags.
    pub tags: Tags,
    /// At most one zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// Profiles.
    pub properties: VmProperties,
}

/// `VirtualMachineProperties`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmProperties {
    /// Size.
    pub hardware_profile: HardwareProfile,
    /// Image and OS disk.
    pub storage_profile: StorageProfile,
    /// User and key.
    pub os_profile: OsProfile,
    /// NICs.
    pub network_profile: NetworkProfile,
    /// The gang's group, for more than one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proximity_placement_group: Option<SubResource>,
    /// `Spot` or `Regular`.
    pub priority: String,
    /// `Delete` (Spot only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_policy: Option<String>,
    /// Max price (Spot only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_profile: Option<BillingProfile>,
}

/// `HardwareProfile`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    /// e.g. `Standard_ND96amsr_A100_v4`.
    pub vm_size: String,
}

/// `StorageProfile`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfile {
    /// The image.
    pub image_reference: ImageReference,
    /// The OS disk.
    pub os_disk: OsDisk,
}

/// `ImageReference`: a marketplace image, or one by id.
#[derive(Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ImageReference {
    /// By id.
    Id {
        /// Its ARM id.
        id: String,
    },
    /// Publisher, offer, SKU, version.
    Marketplace {
        /// Publisher.
        publisher: String,
        /// Offer.
        offer: String,
        /// SKU.
        sku: String,
        /// Version (`latest`).
        version: String,
    },
}

/// `OSDisk`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OsDisk {
    /// `FromImage`.
    pub create_option: String,
    /// `Delete`: it goes with the VM.
    pub delete_option: String,
    /// Size, GiB.
    #[serde(rename = "diskSizeGB", skip_serializing_if = "Option::is_none")]
    pub disk_size_gb: Option<i32>,
    /// Storage type.
    pub managed_disk: ManagedDisk,
}

/// `ManagedDiskParameters`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedDisk {
    /// `Premium_LRS`.
    pub storage_account_type: String,
}

/// `OSProfile`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OsProfile {
    /// Host name.
    pub computer_name: String,
    /// The admin user.
    pub admin_username: String,
    /// SSH only.
    pub linux_configuration: LinuxConfiguration,
}

/// `LinuxConfiguration`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxConfiguration {
    /// No passwords.
    pub disable_password_authentication: bool,
    /// gangway's key.
    pub ssh: SshConfiguration,
}

/// `SshConfiguration`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SshConfiguration {
    /// Keys.
    pub public_keys: Vec<SshPublicKey>,
}

/// `SshPublicKey`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKey {
    /// `/home/{adminUsername}/.ssh/authorized_keys`.
    pub path: String,
    /// The OpenSSH public key.
    pub key_data: String,
}

/// `NetworkProfile`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    /// NICs.
    pub network_interfaces: Vec<NicReference>,
}

/// `NetworkInterfaceReference`.
#[derive(Debug, Serialize)]
pub struct NicReference {
    /// The NIC.
    pub id: String,
    /// Primary, deleted with the VM.
    pub properties: NicReferenceProperties,
}

/// `NetworkInterfaceReferenceProperties`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NicReferenceProperties {
    /// The VM's primary NIC.
    pub primary: bool,
    /// `Delete`: it goes with the VM.
    pub delete_option: String,
}

/// `BillingProfile`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BillingProfile {
    /// USD/hour; -1: up to the on-demand price.
    pub max_price: f64,
}

/// As JSON, for the client.
pub fn json<T: Serialize>(body: &T) -> serde_json::Value {
    serde_json::to_value(body).unwrap_or_default()
}
