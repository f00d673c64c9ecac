//! A list's pages as text, read into objects apart from fetching them: the
//! adapter parses one page on a blocking thread while it fetches the next
//! ([`super::kube_cluster`]'s `list_all`).

use std::future::Future;

use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

use super::cluster::ClusterError;

/// A LIST of `Api<K>`'s resource answered as the API server's text, not yet
/// read as `K` (a `list` call for RBAC, as `Api::list` is).
pub(super) trait ListText {
    /// One page of the list `lp` asks for, as text.
    fn list_text(&self, lp: &ListParams) -> impl Future<Output = Result<String, kube::Error>> + Send;
}

impl<K: kube::Resource + Clone> ListText for Api<K> {
    fn list_text(&self, lp: &ListParams) -> impl Future<Output = Result<String, kube::Error>> + Send {
        let request = kube::core::Request::new(self.resource_url()).list(lp).map(|mut r| {
            r.extensions_mut().insert("list");
            r
        });
        let client = self.clone().into_client();
        async move { client.request_text(request.map_err(kube::Error::BuildRequest)?).await }
    }
}

/// A list's objects as its pages were read. A whole-cluster pods list is
/// hundreds of megabytes of `Pod`s (2 KB each before any string): one `Vec`
/// of them would be held whole beside whatever is built from it, where pages
/// are freed one by one as they are consumed ([`IntoIterator`]).
#[derive(Debug, Clone)]
pub struct Paged<K>(Vec<Vec<K>>);

impl<K> Paged<K> {
    /// The objects of `pages`, in order.
    pub fn new(pages: Vec<Vec<K>>) -> Self {
        Paged(pages)
    }

    /// How many objects.
    pub fn len(&self) -> usize {
        self.0.iter().map(Vec::len).sum()
    }

    /// True when the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Vec::is_empty)
    }

    /// The objects, in order.
    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.0.iter().flatten()
    }

    /// The objects in one `Vec` (for lists small enough to hold twice).
    pub fn into_vec(self) -> Vec<K> {
        let mut all = Vec::with_capacity(self.len());
        all.extend(self);
        all
    }
}

impl<K> IntoIterator for Paged<K> {
    type Item = K;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<K>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

/// A list answer's metadata, its items skipped.
#[derive(serde::Deserialize)]
pub(super) struct ListHead {
    /// Its continue token, among others.
    #[serde(default)]
    pub metadata: kube::core::ListMeta,
}

/// A list answer's items, each still its text (borrowed from the page).
#[derive(serde::Deserialize)]
struct RawItems<'a> {
    #[serde(borrow, default)]
    items: Option<Vec<&'a serde_json::value::RawValue>>,
}

/// One page of a list read into objects, their managed fields dropped and
/// each then `trimmed` (of what the list's reader never reads). Objects are
/// read and trimmed one at a time, and what is kept of each is copied into
/// fresh memory: left where the parse put them, the kept parts sit among the
/// dropped ones and keep their pages resident (155,000 pods: 1.09 GB as
/// parsed and trimmed, 0.65 GB copied; docs/scale.md).
pub(super) fn read_page<K>(op: &str, text: &str, trimmed: fn(&mut K)) -> Result<Vec<K>, ClusterError>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned,
{
    let page: RawItems = serde_json::from_str(text).map_err(|e| unreadable_page(op, &e))?;
    page.items
        .unwrap_or_default()
        .into_iter()
        .map(|raw| {
            let mut o: K = serde_json::from_str(raw.get()).map_err(|e| unreadable_page(op, &e))?;
            o.meta_mut().managed_fields = None;
            trimmed(&mut o);
            Ok(o.clone())
        })
        .collect()
}

/// A page that is not a list of the kind asked for, as the client reports it.
pub(super) fn unreadable_page(op: &str, e: &serde_json::Error) -> ClusterError {
    ClusterError::Transport {
        op: op.to_string(),
        message: format!("the list's answer does not read: {e}"),
    }
}

/// A page's reading, or why its thread failed.
pub(super) fn joined<K>(
    op: &str,
    read: Result<Result<Vec<K>, ClusterError>, tokio::task::JoinError>,
) -> Result<Vec<K>, ClusterError> {
    read.unwrap_or_else(|e| {
        Err(ClusterError::Transport {
            op: op.to_string(),
            message: format!("reading a page failed: {e}"),
        })
    })
}
