//! The route table follows its file's content: a change is installed (each route kept
//! keeps its state), the same content changes nothing, a malformed one keeps the table in
//! force, a missing file is no routes; and a running activator follows a ConfigMap-style
//! swap (a symlink moved to a new file, the mtime of the link's target older).

use std::sync::Arc;

use serde_json::{Value, json};

use super::super::Context;
use super::{Scratch, client_runtime, options, route, until, write_routes};
use crate::Activator;

fn context(scratch: &Scratch) -> Arc<Context> {
    Arc::new(Context::new(options(&scratch.path("routes.json"), json!({}))).unwrap())
}

fn content(routes: &[Value]) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(&json!({"routes": routes})).unwrap())
}

#[test]
fn a_changed_content_is_installed_and_each_route_kept_keeps_its_state() {
    let scratch = Scratch::new("reload");
    let context = context(&scratch);
    let path = scratch.path("routes.json");
    let tables = &context.tables;
    assert!(!tables.read(), "not ready before a table was read");
    let other = json!({"namespace": "ns", "service": "other", "backendHost": "127.0.0.1",
                       "httpPort": 1});
    tables.reload(content(&[route(1, None)]), &path, &context);
    assert!(tables.read());
    let first = tables.current();
    tables.reload(content(&[route(1, None)]), &path, &context);
    assert!(
        Arc::ptr_eq(&first, &tables.current()),
        "the same content: nothing done"
    );
    tables.reload(content(&[other.clone(), route(1, None)]), &path, &context);
    let second = tables.current();
    assert_eq!(second.routes.len(), 2);
    assert!(
        Arc::ptr_eq(&first.holds[0], &second.holds[1]),
        "ns/svc kept its state"
    );
    tables.reload(content(&[other]), &path, &context);
    assert_eq!(tables.current().routes[0].service, "other");
    assert!(Arc::ptr_eq(&second.holds[0], &tables.current().holds[0]));
}

#[test]
fn a_malformed_content_keeps_the_table_in_force_and_a_missing_file_is_no_routes() {
    let scratch = Scratch::new("malformed");
    let context = context(&scratch);
    let path = scratch.path("routes.json");
    let tables = &context.tables;
    tables.reload(Some(b"{not json".to_vec()), &path, &context);
    assert!(!tables.read(), "a malformed first table: still not ready");
    tables.reload(content(&[route(1, None)]), &path, &context);
    let good = tables.current();
    tables.reload(Some(b"{\"routes\": 3}".to_vec()), &path, &context);
    assert!(
        Arc::ptr_eq(&good, &tables.current()),
        "the last good table kept"
    );
    tables.reload(None, &path, &context);
    assert!(tables.current().routes.is_empty());
    assert!(tables.read());
}

#[test]
fn a_moved_backend_is_not_known_ready_until_probed_again() {
    let scratch = Scratch::new("moved");
    let context = context(&scratch);
    let path = scratch.path("routes.json");
    let tables = &context.tables;
    tables.reload(content(&[route(1, None)]), &path, &context);
    let hold = tables.current().holds[0].clone();
    hold.mark_ready();
    let mut models_changed = route(1, None);
    models_changed["models"] = json!(["m", "n"]);
    tables.reload(content(&[models_changed]), &path, &context);
    assert!(hold.ready(), "the same backend: still ready");
    client_runtime().block_on(async {
        // not_ready may start a prober (nothing is held here, so it does not).
        tables.reload(content(&[route(2, None)]), &path, &context);
    });
    assert!(!hold.ready(), "another port: not known ready");
    assert_eq!(hold.route().http_port, 2);
}

#[test]
fn a_running_activator_follows_a_configmap_swap_of_its_file() {
    let scratch = Scratch::new("swap");
    // As a ConfigMap volume: the key is a link into a data folder, replaced by a rename.
    let link = scratch.path("routes.json");
    let first = scratch.path("data-1.json");
    write_routes(&first, &[]);
    std::os::unix::fs::symlink(&first, &link).unwrap();
    let activator = Activator::start(options(&link, json!({}))).unwrap();
    assert_eq!(activator.status(), json!({"routes": []}));
    let second = scratch.path("data-2.json");
    write_routes(&second, &[route(1, None)]);
    let next_link = scratch.path("routes.json.next");
    std::os::unix::fs::symlink(&second, &next_link).unwrap();
    std::fs::rename(&next_link, &link).unwrap();
    let status = |activator: &Activator| activator.status()["routes"].as_array().unwrap().len();
    client_runtime().block_on(until("the swapped table", || status(&activator) == 1));
    std::fs::write(&second, b"{broken").unwrap();
    std::fs::remove_file(&link).unwrap();
    client_runtime().block_on(until("the file gone", || status(&activator) == 0));
    assert_eq!(activator.status()["routes"], json!([]));
}
