//! Prices from the public Azure Retail Prices API
//! (`https://prices.azure.com/api/retail/prices`): no credentials, an OData
//! `$filter`, pages of `Items` linked by `NextPageLink`.
//!
//! One region at a time: every pay-as-you-go meter of the `Virtual
//! Machines` service there (`priceType eq 'Consumption'`, which leaves out
//! Dev/Test and reservations), read page by page and kept only for the
//! sizes asked about. A Linux meter is a size's on-demand price, or its
//! Spot price when the meter is a `Spot` one; Windows meters (`Windows` in
//! the product name) and the older `Low Priority` meters are skipped, as
//! are prices per anything but `1 Hour`. Where one size has several such
//! meters, the lowest wins.

use std::collections::{BTreeMap, BTreeSet};

use gangway_provider::{ErrorKind, PriceQuote, Prices, ProviderError, Result};
use serde::Deserialize;

/// The public endpoint (`GANGWAY_AZURE_PRICES_ENDPOINT` points elsewhere).
pub const RETAIL_ENDPOINT: &str = "https://prices.azure.com";

/// How many times a throttled or failing page is asked again.
const RETRIES: u32 = 6;

/// One page of the API's answer (fields gangway reads).
#[derive(Debug, Deserialize)]
pub struct RetailPage {
    /// The meters of this page.
    #[serde(rename = "Items", default)]
    pub items: Vec<RetailItem>,
    /// The next page, `null` on the last.
    #[serde(rename = "NextPageLink", default)]
    pub next_page_link: Option<String>,
}

/// One meter (fields gangway reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetailItem {
    /// The VM size, `Standard_ND96amsr_A100_v4`.
    #[serde(default)]
    pub arm_sku_name: String,
    /// `eastus`.
    #[serde(default)]
    pub arm_region_name: String,
    /// USD per `unit_of_measure`.
    #[serde(default)]
    pub retail_price: f64,
    /// `1 Hour`.
    #[serde(default)]
    pub unit_of_measure: String,
    /// `Virtual Machines NDamsrA100v4 Series` (`... Windows` for Windows).
    #[serde(default)]
    pub product_name: String,
    /// `ND96amsr A100 v4 Spot`.
    #[serde(default)]
    pub sku_name: String,
    /// `ND96amsr A100 v4 Spot`.
    #[serde(default)]
    pub meter_name: String,
    /// `Consumption`, `DevTestConsumption`, `Reservation`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `USD`.
    #[serde(default)]
    pub currency_code: String,
}

/// What a meter prices, if it is one gangway reads.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Market {
    /// Pay-as-you-go Linux.
    OnDemand,
    /// Spot Linux.
    Spot,
}

impl RetailItem {
    /// Whether this meter is a Linux pay-as-you-go or Spot hourly price.
    pub fn market(&self) -> Option<Market> {
        let named = |w: &str| self.meter_name.contains(w) || self.sku_name.contains(w);
        if self.kind != "Consumption"
            || self.unit_of_measure != "1 Hour"
            || !(self.currency_code.is_empty() || self.currency_code == "USD")
            || self.product_name.contains("Windows")
            || named("Low Priority")
            || !self.retail_price.is_finite()
            || self.retail_price <= 0.0
        {
            return None;
        }
        Some(if named("Spot") {
            Market::Spot
        } else {
            Market::OnDemand
        })
    }
}

/// The Retail Prices endpoint: `GANGWAY_AZURE_PRICES_ENDPOINT`, else Azure's.
pub fn endpoint() -> String {
    std::env::var("GANGWAY_AZURE_PRICES_ENDPOINT")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| RETAIL_ENDPOINT.into())
}

/// The first page's URL for `region`'s pay-as-you-go VM meters.
pub fn first_page(endpoint: &str, region: &str) -> String {
    let filter = format!(
        "serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
    );
    let mut q = String::new();
    for b in filter.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                q.push(b as char)
            }
            _ => q.push_str(&format!("%{b:02X}")),
        }
    }
    format!("{endpoint}/api/retail/prices?$filter={q}")
}

/// The lowest on-demand and Spot price per asked size, folded in page by
/// page (nothing else of a page is kept).
#[derive(Debug, Default)]
pub struct Folded {
    /// size -> (on-demand, spot).
    pub best: BTreeMap<String, (Option<f64>, Option<f64>)>,
    /// Pages read.
    pub pages: usize,
}

impl Folded {
    /// Takes what `page` says about the sizes in `wanted`.
    pub fn add(&mut self, page: &RetailPage, region: &str, wanted: &BTreeSet<&str>) {
        self.pages += 1;
        for item in &page.items {
            if item.arm_region_name != region || !wanted.contains(item.arm_sku_name.as_str()) {
                continue;
            }
            let Some(m) = item.market() else { continue };
            let e = self.best.entry(item.arm_sku_name.clone()).or_default();
            let slot = match m {
                Market::OnDemand => &mut e.0,
                Market::Spot => &mut e.1,
            };
            *slot = Some(slot.map_or(item.retail_price, |p: f64| p.min(item.retail_price)));
        }
    }

    /// The quotes for `region`, and a note naming the asked sizes it has
    /// no Linux price for.
    pub fn prices(self, region: &str, asked: &[String]) -> Prices {
        let mut out = Prices::default();
        let mut missing = Vec::new();
        for t in asked {
            match self.best.get(t) {
                Some((price, spot)) if price.is_some() || spot.is_some() => {
                    out.quotes.push(PriceQuote {
                        instance_type: t.clone(),
                        region: region.to_string(),
                        zone: None,
                        price: *price,
                        spot_price: *spot,
                        accelerator: None,
                        accelerator_count: None,
                    })
                }
                _ => missing.push(t.as_str()),
            }
        }
        if !missing.is_empty() {
            out.notes.push(format!(
                "{region}: the Retail Prices API lists no Linux price for {}; not offered there",
                missing.join(", ")
            ));
        }
        out
    }
}

fn err(kind: ErrorKind, region: &str, message: String) -> ProviderError {
    ProviderError::new(kind, "azure", region, message)
}

/// Reads every page of `region`'s meters from `endpoint` and returns the
/// quotes for `types`. Throttling (429, honouring `Retry-After`) and server
/// errors are waited out a few times, then reported as transient.
pub async fn region_prices(
    http: &reqwest::Client,
    endpoint: &str,
    region: &str,
    types: &[String],
) -> Result<Prices> {
    let wanted: BTreeSet<&str> = types.iter().map(String::as_str).collect();
    let mut folded = Folded::default();
    let mut url = first_page(endpoint, region);
    loop {
        let page = get_page(http, &url, region).await?;
        folded.add(&page, region, &wanted);
        match page.next_page_link {
            Some(next) if !next.is_empty() => {
                if next == url {
                    return Err(err(
                        ErrorKind::Fatal,
                        region,
                        format!("the Retail Prices API linked page {url} to itself"),
                    ));
                }
                url = next
            }
            _ => break,
        }
    }
    tracing::debug!("azure retail prices {region}: {} page(s)", folded.pages);
    Ok(folded.prices(region, types))
}

async fn get_page(http: &reqwest::Client, url: &str, region: &str) -> Result<RetailPage> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= RETRIES;
        let resp = match http
            .get(url)
            .header("Accept", "application/json")
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) if !last => {
                tracing::debug!("retail prices {url}: {e}; again");
                tokio::time::sleep(crate::arm::backoff(attempt)).await;
                continue;
            }
            Err(e) => {
                return Err(err(
                    ErrorKind::Transient,
                    region,
                    format!(
                        "the Retail Prices API did not answer: {}",
                        gangway_provider::error_chain(&e)
                    ),
                ))
            }
        };
        let status = resp.status();
        let wait = crate::arm::retry_after(resp.headers());
        let text = resp.text().await.unwrap_or_default();
        if status.as_u16() == 429 || status.is_server_error() {
            if !last {
                tokio::time::sleep(wait.unwrap_or_else(|| crate::arm::backoff(attempt))).await;
                continue;
            }
            return Err(err(
                ErrorKind::Transient,
                region,
                format!("the Retail Prices API still answers {status} after {RETRIES} tries"),
            ));
        }
        if !status.is_success() {
            let said: String = text.chars().take(300).collect();
            return Err(err(
                ErrorKind::InvalidRequest,
                region,
                format!("the Retail Prices API answered {status}: {said}"),
            ));
        }
        return serde_json::from_str(&text).map_err(|e| {
            err(
                ErrorKind::Fatal,
                region,
                format!("the Retail Prices API's answer is not the documented shape: {e}"),
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(sku: &str, price: f64, product: &str, meter: &str, kind: &str) -> RetailItem {
        RetailItem {
            arm_sku_name: sku.into(),
            arm_region_name: "eastus".into(),
            retail_price: price,
            unit_of_measure: "1 Hour".into(),
            product_name: product.into(),
            sku_name: meter.into(),
            meter_name: meter.into(),
            kind: kind.into(),
            currency_code: "USD".into(),
        }
    }

    #[test]
    fn linux_pay_as_you_go_and_spot_are_read_the_rest_skipped() {
        let s = "Standard_ND96amsr_A100_v4";
        let p = "Virtual Machines NDamsrA100v4 Series";
        let w = "Virtual Machines NDamsrA100v4 Series Windows";
        let page = RetailPage {
            items: vec![
                item(s, 32.77, p, "ND96amsr A100 v4", "Consumption"),
                item(s, 8.52, p, "ND96amsr A100 v4 Spot", "Consumption"),
                item(s, 40.0, w, "ND96amsr A100 v4", "Consumption"),
                item(s, 9.0, w, "ND96amsr A100 v4 Spot", "Consumption"),
                item(s, 5.0, p, "ND96amsr A100 v4 Low Priority", "Consumption"),
                item(s, 16.0, p, "ND96amsr A100 v4", "DevTestConsumption"),
                item(s, 20.0, p, "ND96amsr A100 v4", "Reservation"),
                item(
                    "Standard_F2s_v2",
                    0.1,
                    "Virtual Machines FSv2 Series",
                    "F2s v2",
                    "Consumption",
                ),
            ],
            next_page_link: None,
        };
        let mut f = Folded::default();
        let asked = vec![s.to_string(), "Standard_NC4as_T4_v3".to_string()];
        f.add(&page, "eastus", &asked.iter().map(String::as_str).collect());
        let got = f.prices("eastus", &asked);
        assert_eq!(got.quotes.len(), 1);
        assert_eq!(got.quotes[0].price, Some(32.77));
        assert_eq!(got.quotes[0].spot_price, Some(8.52));
        assert_eq!(got.quotes[0].zone, None);
        assert!(
            got.notes[0].contains("Standard_NC4as_T4_v3"),
            "{:?}",
            got.notes
        );
    }

    #[test]
    fn the_first_page_filters_on_service_region_and_pay_as_you_go() {
        let u = first_page("https://prices.azure.com", "eastus");
        assert_eq!(
            u,
            "https://prices.azure.com/api/retail/prices?$filter=\
             serviceName%20eq%20%27Virtual%20Machines%27%20and%20armRegionName%20eq%20\
             %27eastus%27%20and%20priceType%20eq%20%27Consumption%27"
        );
    }
}
