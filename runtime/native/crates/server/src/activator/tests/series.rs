//! The activator's series are the contract's (`activator.tsv`, generated from
//! `kubeinfer/contract/metric_series.py`; the Python side checks the listing is current):
//! every name its hooks use is listed with its kind and labels, and a scrape exports
//! those families only, each route's made at zero with the route.

use serde_json::json;

use super::super::metrics::{Outcome, names};
use super::{Scratch, activator, client_runtime, free_port, metric};
use crate::metrics::Kind;
use crate::metrics::contract::series_of;

#[test]
fn every_name_the_activator_uses_is_in_its_listing_with_its_kind_and_labels() {
    let listing = series_of(include_str!("../../metrics/activator.tsv"));
    let expected = [
        (
            names::HELD_REQUESTS,
            Kind::Gauge,
            vec!["namespace", "service"],
        ),
        (
            names::REQUESTS,
            Kind::Counter,
            vec!["namespace", "service", "outcome"],
        ),
        (
            names::HOLD_DURATION,
            Kind::Histogram,
            vec!["namespace", "service"],
        ),
        (names::UNROUTED_REQUESTS, Kind::Counter, vec![]),
    ];
    assert_eq!(listing.len(), expected.len(), "one listed series per name");
    for (name, kind, labels) in expected {
        let spec = listing
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        assert_eq!((spec.kind, &spec.labels), (kind, &labels), "{name}");
    }
    let outcomes = listing
        .iter()
        .find(|s| s.name == names::REQUESTS)
        .unwrap()
        .help;
    for outcome in Outcome::ALL {
        assert!(
            outcomes.contains(outcome.label()),
            "{} is not in its help",
            outcome.label()
        );
    }
}

#[test]
fn a_scrape_exports_the_listed_families_only_each_route_at_zero_from_its_start() {
    let scratch = Scratch::new("series");
    let activator = activator(&scratch, free_port(), None, json!({}));
    let port = activator.http_port();
    let listing = series_of(include_str!("../../metrics/activator.tsv"));
    client_runtime().block_on(async {
        let (_, headers, body) = super::call(port, "GET", "/metrics", "127.0.0.1", b"").await;
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        let text = String::from_utf8(body.to_vec()).unwrap();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let family = line.split(' ').nth(2).unwrap();
            assert!(
                listing.iter().any(|s| s.name == family),
                "{family} is not listed"
            );
        }
        assert!(text.ends_with("# EOF\n"));
        for outcome in Outcome::ALL {
            let labels = format!(
                r#"{{namespace="ns",service="svc",outcome="{}"}}"#,
                outcome.label()
            );
            let counted = metric(port, "kubeinfer_activator_requests_total", &labels).await;
            assert_eq!(counted, Some(0.0), "{}", outcome.label());
        }
    });
}
