//! The route table in force, and its file followed: read every poll interval and installed
//! when its content changed (a ConfigMap volume swaps a symlink to a new directory, so
//! its mtime says nothing; the bytes do). A missing file is a table of no routes; one that
//! cannot be read or parsed is logged and the table in force kept. Each route's state
//! ([`Hold`]) outlives a reload that keeps the route, and the requests held for a route
//! the table drops keep theirs until they are answered.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use super::hold::Hold;
use super::routes::{Route, parse_routes};
use super::{Context, Stage};
use crate::state::lock;

/// The routes in force and their states, in the file's order.
pub struct Table {
    pub routes: Vec<Route>,
    pub holds: Vec<Arc<Hold>>,
}

impl Table {
    fn empty() -> Arc<Table> {
        Arc::new(Table {
            routes: Vec::new(),
            holds: Vec::new(),
        })
    }
}

/// The table in force, swapped whole on a reload.
pub struct Tables {
    current: RwLock<Arc<Table>>,
    /// A table has been read (an empty one counts): the activator is ready.
    read: AtomicBool,
    /// The file's content last read (None: missing), to tell a change.
    last: Mutex<Option<Option<Vec<u8>>>>,
}

impl Tables {
    pub fn new() -> Tables {
        Tables {
            current: RwLock::new(Table::empty()),
            read: AtomicBool::new(false),
            last: Mutex::new(None),
        }
    }

    pub fn current(&self) -> Arc<Table> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A table has been read.
    pub fn read(&self) -> bool {
        self.read.load(Ordering::Relaxed)
    }

    /// Installs the table `content` holds (None: the file is missing) if it differs from
    /// the last content seen; a content that does not parse is logged once and the table
    /// in force kept.
    pub fn reload(&self, content: Option<Vec<u8>>, path: &Path, context: &Arc<Context>) {
        {
            let mut last = lock(&self.last);
            if last.as_ref() == Some(&content) {
                return;
            }
            *last = Some(content.clone());
        }
        let text = content.as_deref().map(String::from_utf8_lossy);
        match parse_routes(text.as_deref().unwrap_or("")) {
            Ok(routes) => {
                let count = routes.len();
                self.install(routes, context);
                self.read.store(true, Ordering::Relaxed);
                let (file, missing) = (path.display(), content.is_none());
                log::info!("Loaded routes file={file} routes={count} missing={missing}");
            }
            Err(error) => {
                log::warn!(
                    "Kept the routes in force: the routes file is invalid file={} error={error}",
                    path.display()
                );
            }
        }
    }

    /// No routes any more: the activator stopped. Each route's state holds the activator's
    /// context, which holds this table: emptied, the two let each other go.
    pub fn clear(&self) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Table::empty();
    }

    /// `routes` in force, each keeping the state it had under the table before.
    fn install(&self, routes: Vec<Route>, context: &Arc<Context>) {
        let before = self.current();
        let mut kept: HashMap<(&str, &str), &Arc<Hold>> = (before.routes.iter())
            .zip(&before.holds)
            .map(|(r, h)| ((r.namespace.as_str(), r.service.as_str()), h))
            .collect();
        let holds = (routes.iter())
            .map(
                |route| match kept.remove(&(route.namespace.as_str(), route.service.as_str())) {
                    Some(hold) => {
                        hold.update(route.clone());
                        hold.clone()
                    }
                    None => Hold::new(route.clone(), context.clone()),
                },
            )
            .collect();
        let table = Arc::new(Table { routes, holds });
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = table;
    }
}

impl Default for Tables {
    fn default() -> Self {
        Tables::new()
    }
}

/// The routes file's content: None when it is missing; an error for one that exists and
/// cannot be read.
pub fn read_routes_file(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(content) => Ok(Some(content)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Reads the routes file once and installs what changed; a read that fails is logged
/// and changes nothing.
pub async fn refresh(context: &Arc<Context>, path: &Path) {
    let owned = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || read_routes_file(&owned)).await;
    match read {
        Ok(Ok(content)) => context.tables.reload(content, path, context),
        Ok(Err(error)) => log::warn!(
            "Kept the routes in force: cannot read the routes file file={} error={error}",
            path.display()
        ),
        Err(error) => log::warn!("Routes file read failed error={error}"),
    }
}

/// Follows the routes file every poll interval until the activator stops.
pub async fn follow(context: Arc<Context>, path: PathBuf) {
    let mut stage: watch::Receiver<Stage> = context.stage.subscribe();
    let every = context.options.routes_poll();
    loop {
        let stopped = tokio::select! {
            () = tokio::time::sleep(every) => false,
            _ = stage.wait_for(|s| *s == Stage::Stopped) => true,
        };
        if stopped {
            return;
        }
        refresh(&context, &path).await;
    }
}
