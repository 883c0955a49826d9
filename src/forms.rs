//! The forms Requests carry: one copy of each distinct Request `data` (a form's schema, or an editable
//! approval's tool schema) with its compiled validator, shared by every Request that carries it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value};

use crate::{approvals, lock, validation};

/// The most distinct `data` objects [`Forms`] keeps; it starts over when full.
const MAX_SHARED_DATA: usize = 256;

/// One copy of each distinct Request `data` (a form's schema) and of its compiled validator: elicitations
/// repeat their schemas, and a schema is most of a pending Request's memory.
#[derive(Debug, Default)]
pub struct Forms(Mutex<Copies>);

#[derive(Debug, Default)]
struct Copies {
    /// By the data's JSON text.
    by_text: HashMap<String, Held>,
    /// By the address of a copy held here (a copy held cannot be freed, so its address names it alone).
    by_address: HashMap<usize, Held>,
}

/// A Request's `data` and the validators of its schemas (`None` without one).
#[derive(Debug, Clone)]
pub struct Held {
    pub data: Arc<Map<String, Value>>,
    /// Of the form's `schema`, which an answer's data must fit.
    pub validator: Option<Arc<jsonschema::Validator>>,
    /// Of an editable approval's tool `inputSchema`, which changed arguments must fit; `None` also when the
    /// tool's schema does not compile, and no change can be checked.
    pub arguments: Option<Arc<jsonschema::Validator>>,
}

impl Forms {
    /// The copy of `data` already held, or `data` itself with its schema compiled (which must succeed), now held.
    pub fn share(&self, data: Arc<Map<String, Value>>) -> Result<Held, String> {
        if let Some(copy) = self.lock().by_address.get(&address(&data)) {
            return Ok(copy.clone());
        }
        let key = serde_json::to_string(&data).unwrap_or_default();
        if let Some(copy) = self.lock().by_text.get(&key) {
            return Ok(copy.clone());
        }
        let validator = data
            .get("schema")
            .map(|schema| validation::compile(schema).map(Arc::new))
            .transpose()?;
        let arguments = approvals::input_schema(&data)
            .and_then(|schema| validation::compile_arguments(schema).ok())
            .map(Arc::new);
        let fresh = Held {
            data,
            validator,
            arguments,
        };
        let mut copies = self.lock();
        if copies.by_text.len() >= MAX_SHARED_DATA {
            copies.by_text.clear();
            copies.by_address.clear();
        }
        copies.by_address.insert(address(&fresh.data), fresh.clone());
        copies.by_text.insert(key, fresh.clone());
        Ok(fresh)
    }

    /// The validator of a Request's data (compiled again if it is no longer held).
    pub fn validator(&self, data: &Arc<Map<String, Value>>) -> Option<Arc<jsonschema::Validator>> {
        self.share(data.clone()).ok().and_then(|held| held.validator)
    }

    /// The validator of the arguments an editable approval's data lets an approver change.
    pub fn arguments(&self, data: &Arc<Map<String, Value>>) -> Option<Arc<jsonschema::Validator>> {
        self.share(data.clone()).ok().and_then(|held| held.arguments)
    }

    fn lock(&self) -> MutexGuard<'_, Copies> {
        lock(&self.0)
    }
}

/// Where a copy of some data lives.
fn address(data: &Arc<Map<String, Value>>) -> usize {
    Arc::as_ptr(data) as usize
}
