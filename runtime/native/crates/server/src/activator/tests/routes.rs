//! The route table's parsing and which route a request is for: by the name it was sent
//! to, else by the one route that lists its model (from an HTTP path, or a gRPC message's
//! field 1).

use prost::Message;
use serde_json::json;

use super::super::routes::{
    Matched, Route, match_route, model_of_grpc_message, model_of_path, parse_routes,
};

fn route(namespace: &str, service: &str, models: &[&str]) -> Route {
    Route {
        namespace: namespace.into(),
        service: service.into(),
        models: models.iter().map(|m| m.to_string()).collect(),
        backend_host: format!("{service}-pods.{namespace}.svc.cluster.local"),
        http_port: 8000,
        grpc_port: Some(8001),
    }
}

fn table() -> Vec<Route> {
    vec![
        route("team-a", "resnet", &["resnet", "shared"]),
        route("team-b", "resnet", &["resnet-b"]),
        route("team-b", "bert", &["bert", "shared"]),
    ]
}

#[test]
fn a_table_parses_with_its_grpc_port_optional() {
    let text = json!({"routes": [
        {"namespace": "ns", "service": "a", "models": ["m"], "backendHost": "a-pods.ns",
         "httpPort": 8000, "grpcPort": 8001},
        {"namespace": "ns", "service": "b", "models": [], "backendHost": "b-pods.ns",
         "httpPort": 8000, "grpcPort": null},
        {"namespace": "ns", "service": "c", "backendHost": "c-pods.ns", "httpPort": 8000},
    ]})
    .to_string();
    let routes = parse_routes(&text).unwrap();
    assert_eq!(routes.len(), 3);
    assert_eq!(routes[0].grpc_port, Some(8001));
    assert_eq!((routes[1].grpc_port, routes[2].grpc_port), (None, None));
    assert_eq!(routes[0].key(), "ns/a");
    assert_eq!(parse_routes("").unwrap(), vec![], "an empty key: no routes");
    let newer = r#"{"routes": [{"namespace": "ns", "service": "a", "backendHost": "h",
                    "httpPort": 1, "weight": 3}], "version": 2}"#;
    assert_eq!(
        parse_routes(newer).unwrap().len(),
        1,
        "fields it does not know: ignored"
    );
    assert_eq!(parse_routes(r#"{"routes": []}"#).unwrap(), vec![]);
}

#[test]
fn a_table_that_is_not_one_is_refused_saying_why() {
    let one = |extra: serde_json::Value| {
        let mut route = json!({"namespace": "ns", "service": "a", "backendHost": "h",
                                "httpPort": 8000});
        for (key, value) in extra.as_object().unwrap() {
            route[key] = value.clone();
        }
        json!({"routes": [route]}).to_string()
    };
    let refused = [
        ("{", "EOF"),
        (r#"{"routes": {}}"#, "expected a sequence"),
        (r#"{"route": []}"#, "missing field `routes`"),
        (&one(json!({"httpPort": "x"})), "invalid type"),
        (&one(json!({"httpPort": 70000})), "invalid value"),
        (
            &one(json!({"backendHost": ""})),
            "needs a namespace, a service and a backendHost",
        ),
    ];
    for (text, says) in refused {
        let error = parse_routes(text).expect_err(text);
        assert!(error.contains(says), "{text}: {error}");
    }
    let twice = json!({"routes": [
        {"namespace": "ns", "service": "a", "backendHost": "h", "httpPort": 1},
        {"namespace": "ns", "service": "a", "backendHost": "g", "httpPort": 2},
    ]});
    let error = parse_routes(&twice.to_string()).unwrap_err();
    assert_eq!(error, "route ns/a is listed twice");
}

#[test]
fn the_host_names_its_route_by_service_then_namespace_its_port_aside() {
    let routes = table();
    let cases = [
        ("bert", Matched::Route(2)),
        ("bert:8000", Matched::Route(2)),
        ("resnet.team-b", Matched::Route(1)),
        ("resnet.team-a.svc.cluster.local:80", Matched::Route(0)),
        ("resnet.team-a.svc", Matched::Route(0)),
        ("bert.team-a", Matched::Unrouted),
        ("127.0.0.1:8000", Matched::Unrouted),
        ("[::1]:8000", Matched::Unrouted),
        ("resnet", Matched::Unrouted), // in two namespaces, and no model to tell
    ];
    for (host, matched) in cases {
        assert_eq!(match_route(&routes, Some(host), None), matched, "{host}");
    }
}

#[test]
fn without_the_tables_name_the_one_route_listing_the_model_is_taken() {
    let routes = table();
    assert_eq!(
        match_route(&routes, Some("10.0.0.7:8000"), Some("bert")),
        Matched::Route(2)
    );
    assert_eq!(
        match_route(&routes, None, Some("resnet-b")),
        Matched::Route(1)
    );
    assert_eq!(match_route(&routes, None, Some("gpt")), Matched::Unrouted);
    assert_eq!(match_route(&routes, None, None), Matched::Unrouted);
    assert_eq!(
        match_route(&routes, None, Some("shared")),
        Matched::Ambiguous(vec!["team-a".into(), "team-b".into()])
    );
    // A bare service name in two namespaces: the model says which.
    assert_eq!(
        match_route(&routes, Some("resnet"), Some("resnet-b")),
        Matched::Route(1)
    );
    // The name wins over the model.
    assert_eq!(
        match_route(&routes, Some("bert.team-b"), Some("resnet")),
        Matched::Route(2)
    );
}

#[test]
fn an_http_path_names_its_model() {
    let cases = [
        ("/v2/models/resnet/infer", Some("resnet")),
        ("/v2/models/resnet/versions/3/infer", Some("resnet")),
        ("/v2/models/resnet", Some("resnet")),
        ("/v2/models/resnet/ready", Some("resnet")),
        ("/v2/models//infer", None),
        ("/v2/health/ready", None),
        ("/metrics", None),
    ];
    for (path, model) in cases {
        assert_eq!(model_of_path(path), model, "{path}");
    }
}

/// What ModelInferRequest, ModelReadyRequest and ModelMetadataRequest share: field 1.
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    version: String,
    #[prost(bytes = "vec", tag = "7")]
    rest: Vec<u8>,
}

/// `message` in gRPC's frame: a compression byte and the length, big-endian.
fn framed(message: &[u8], compressed: u8) -> Vec<u8> {
    let mut frame = vec![compressed];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

#[test]
fn a_grpc_message_names_its_model_in_field_1() {
    let long = "m".repeat(300); // a two-byte varint length
    for name in ["resnet", long.as_str(), "ünïcode"] {
        let message = Named {
            name: name.into(),
            version: "1".into(),
            rest: vec![0; 64],
        }
        .encode_to_vec();
        assert_eq!(model_of_grpc_message(&framed(&message, 0)), Some(name));
        assert_eq!(
            model_of_grpc_message(&framed(&message, 1)),
            None,
            "compressed"
        );
    }
    let versions_only = Named {
        name: String::new(),
        version: "1".into(),
        rest: vec![],
    }
    .encode_to_vec();
    assert_eq!(model_of_grpc_message(&framed(&versions_only, 0)), None);
    let cut = framed(
        &Named {
            name: "resnet".into(),
            ..Named::default()
        }
        .encode_to_vec(),
        0,
    );
    assert_eq!(
        model_of_grpc_message(&cut[..cut.len() - 2]),
        None,
        "cut short"
    );
    assert_eq!(model_of_grpc_message(&[0, 0, 0]), None);
    assert_eq!(
        model_of_grpc_message(&framed(&[0x0a, 2, 0xff, 0xfe], 0)),
        None,
        "not UTF-8"
    );
}
