//! The kube-apiserver's own checks, re-implemented for the tests.
//!
//! No kube-apiserver runs on our machines, so the integration tests play its part with
//! these functions. They work on plain `serde_json::Value` objects (a Pod, a workload,
//! or a bare pod spec) and are written from the Kubernetes sources cited in
//! `shared/K8S-FACTS.md` (the "§" numbers below), independently of podmend's own code:
//! nothing here may call into the crate under test. That includes [`Quantity`], a small
//! exact parser of Kubernetes resource quantities.
//!
//! Scope: the rules podmend's rewrites can break (node affinity, nodeName, resources,
//! tolerations, LimitRange, the AdmissionReview protocol, JSON Patch application and
//! re-defaulting). Everything else a real API server checks (names, volumes, probes, ...)
//! is left to the official schema check in `schema.rs` or is out of scope.
//!
//! Feature gates are taken at their Kubernetes 1.37 defaults: `PodLevelResources` is on
//! (beta since 1.34, §4.4); alpha gates are off.

use serde_json::{Map, Value};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

// ------------------------------------------------------------------------------------------------
// Quantities
// ------------------------------------------------------------------------------------------------

/// `resource.MaxMilliValue` in `k8s.io/apimachinery/pkg/api/resource`: the largest value whose
/// milli-value still fits an `int64`.
pub const MAX_MILLI_VALUE: i64 = i64::MAX / 1000;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// An exact Kubernetes resource quantity (`resource.Quantity`), held as a signed count of
/// nano-units.
///
/// It does what `src/quantity.rs` does, and stays a separate implementation on purpose: an
/// independent oracle, so that a misreading of `ParseQuantity` in podmend fails the tests
/// instead of being shared by them. Do not replace one with the other.
///
/// Parsing follows `resource.ParseQuantity` (`k8s.io/apimachinery/pkg/api/resource/quantity.go`):
///
/// ```text
/// <quantity> ::= <sign>? <number> <suffix>
/// <number>   ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
/// <suffix>   ::= "" | n | u | m | k | M | G | T | P | E        (decimal SI)
///              | Ki | Mi | Gi | Ti | Pi | Ei                  (binary SI)
///              | e<signed integer> | E<signed integer>         (decimal exponent)
/// ```
///
/// Like `ParseQuantity`, a non-zero value is rounded up (away from zero) to a whole nano-unit
/// and its magnitude is capped at 2^63-1. Because every parsed value is then a whole number of
/// nano-units no larger than 2^63-1, an `i128` count of nano-units holds it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// The quantity "0".
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    /// Parses a quantity string exactly as `resource.ParseQuantity` does (no surrounding
    /// whitespace allowed; JSON decoding trims it first, see [`Quantity::from_json`]).
    pub fn parse(input: &str) -> Result<Quantity, String> {
        let bad = || {
            format!(
                "quantity {input:?}: quantities must match the regular expression \
                 '^([+-]?[0-9.]+)([eEinumkKMGTPE]*[-+]?[0-9]*)$'"
            )
        };
        let (negative, whole, fraction, suffix) = split_quantity(input).ok_or_else(bad)?;
        let multiplier = Multiplier::of_suffix(suffix).ok_or_else(bad)?;
        // value = digits * 10^exponent, exactly, as a big decimal digit string.
        let mut digits: Vec<u8> = whole
            .bytes()
            .chain(fraction.bytes())
            .map(|c| c - b'0')
            .collect();
        let mut exponent: i64 = -(fraction.len() as i64);
        match multiplier {
            Multiplier::Decimal(e) => exponent += e,
            Multiplier::Binary(k) => {
                for _ in 0..k {
                    multiply_digits(&mut digits, 1024);
                }
            }
        }
        Ok(Quantity::of_digits(negative, digits, exponent))
    }

    /// `±digits × 10^exponent`, rounded up (away from zero) to a whole nano-unit and its
    /// magnitude capped at 2^63-1, as `ParseQuantity` does.
    fn of_digits(negative: bool, mut digits: Vec<u8>, mut exponent: i64) -> Quantity {
        let first_nonzero = digits.iter().position(|&d| d != 0);
        let Some(first_nonzero) = first_nonzero else {
            return Quantity::ZERO;
        };
        digits.drain(..first_nonzero);

        // Round up (away from zero) to a whole nano-unit.
        if exponent < -9 {
            let drop = (-9 - exponent) as u64;
            if drop >= digits.len() as u64 {
                digits = vec![1];
            } else {
                let keep = digits.len() - drop as usize;
                let tail_nonzero = digits[keep..].iter().any(|&d| d != 0);
                digits.truncate(keep);
                if tail_nonzero {
                    increment_digits(&mut digits);
                }
            }
            exponent = -9;
        }

        // Cap the magnitude at 2^63-1.
        let cap = i128::from(i64::MAX) * NANOS_PER_UNIT;
        let integer_digits = digits.len() as i64 + exponent;
        let magnitude = if integer_digits > 19 {
            cap
        } else {
            // At most 19 integer digits and 9 fraction digits: fits an i128 easily.
            let mut n: i128 = 0;
            for d in &digits {
                n = n * 10 + i128::from(*d);
            }
            for _ in 0..(exponent + 9) {
                n *= 10;
            }
            n.min(cap)
        };
        Quantity {
            nanos: if negative { -magnitude } else { magnitude },
        }
    }

    /// Decodes a quantity from its JSON form the way `Quantity.UnmarshalJSON` does: `null` is
    /// zero, a string or a number is trimmed of white space and parsed.
    pub fn from_json(value: &Value) -> Result<Quantity, String> {
        match value {
            Value::Null => Ok(Quantity::ZERO),
            Value::String(s) => Quantity::parse(s.trim()),
            Value::Number(n) => Quantity::parse(&n.to_string()),
            other => Err(format!(
                "quantity must be a string or a number, got {other}"
            )),
        }
    }

    /// A quantity of `nanos` nano-units.
    pub fn from_nanos(nanos: i128) -> Quantity {
        Quantity { nanos }
    }

    /// A quantity of `milli` milli-units.
    pub fn from_milli(milli: i64) -> Quantity {
        Quantity {
            nanos: i128::from(milli) * 1_000_000,
        }
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// -1, 0 or 1, like `Quantity.Sign()`.
    pub fn sign(&self) -> i32 {
        self.nanos.signum() as i32
    }

    /// Exact sum; `None` on overflow (far beyond anything the API server accepts).
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    /// `Quantity.Value()`: the value rounded up (away from zero) to an integer, saturated to
    /// the `i64` range.
    pub fn value(&self) -> i64 {
        scaled_away_from_zero(self.nanos, NANOS_PER_UNIT)
    }

    /// `Quantity.MilliValue()`: the value in milli-units, rounded up (away from zero),
    /// saturated to the `i64` range.
    pub fn milli_value(&self) -> i64 {
        scaled_away_from_zero(self.nanos, 1_000_000)
    }

    /// `Quantity.RoundUp(-3)` as `SetDefaults_ResourceList` applies it (§4.2): rounds up
    /// (away from zero) to a whole milli-unit.
    pub fn round_up_to_milli(&self) -> Quantity {
        Quantity {
            nanos: i128::from(self.milli_value()) * 1_000_000,
        }
    }
}

/// A quantity's sign, whole digits, fraction digits and suffix (letters from "eEinumkKMGTP",
/// an optional sign, digits), as `ParseQuantity` splits it; `None` when it has no number or
/// its suffix is not of that form.
fn split_quantity(input: &str) -> Option<(bool, &str, &str, &str)> {
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&first) = bytes.first()
        && (first == b'+' || first == b'-')
    {
        negative = first == b'-';
        i = 1;
    }
    let whole_start = i;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let whole = &input[whole_start..i];
    let mut fraction = "";
    if i < bytes.len() && bytes[i] == b'.' {
        i += 1;
        let fraction_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        fraction = &input[fraction_start..i];
    }
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }

    // The suffix: letters from "eEinumkKMGTP", then an optional sign, then digits.
    let suffix = &input[i..];
    let sb = suffix.as_bytes();
    let mut j = 0;
    while j < sb.len() && b"eEinumkKMGTP".contains(&sb[j]) {
        j += 1;
    }
    if j < sb.len() && (sb[j] == b'+' || sb[j] == b'-') {
        j += 1;
    }
    while j < sb.len() && sb[j].is_ascii_digit() {
        j += 1;
    }
    if j != sb.len() {
        return None;
    }

    Some((negative, whole, fraction, suffix))
}

/// A quantity's multiplier: a power of ten, or of 1024.
enum Multiplier {
    Decimal(i64),
    Binary(u32),
}

impl Multiplier {
    /// The multiplier a suffix names; `None` for a suffix `ParseQuantity` refuses.
    fn of_suffix(suffix: &str) -> Option<Multiplier> {
        Some(match suffix {
            "n" => Multiplier::Decimal(-9),
            "u" => Multiplier::Decimal(-6),
            "m" => Multiplier::Decimal(-3),
            "" => Multiplier::Decimal(0),
            "k" => Multiplier::Decimal(3),
            "M" => Multiplier::Decimal(6),
            "G" => Multiplier::Decimal(9),
            "T" => Multiplier::Decimal(12),
            "P" => Multiplier::Decimal(15),
            "E" => Multiplier::Decimal(18),
            "Ki" => Multiplier::Binary(1),
            "Mi" => Multiplier::Binary(2),
            "Gi" => Multiplier::Binary(3),
            "Ti" => Multiplier::Binary(4),
            "Pi" => Multiplier::Binary(5),
            "Ei" => Multiplier::Binary(6),
            s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
                // Go: strconv.ParseInt(suffix[1:], 10, 64), then a plain int32 conversion.
                let exponent: i64 = s[1..].parse().ok()?;
                Multiplier::Decimal(i64::from(exponent as i32))
            }
            _ => return None,
        })
    }
}

impl fmt::Display for Quantity {
    /// A plain decimal rendering with the coarsest exact decimal SI suffix ("2", "500m",
    /// "1500u", "7n"). Only used in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nanos;
        if n % NANOS_PER_UNIT == 0 {
            write!(f, "{}", n / NANOS_PER_UNIT)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}m", n / 1_000_000)
        } else if n % 1_000 == 0 {
            write!(f, "{}u", n / 1_000)
        } else {
            write!(f, "{n}n")
        }
    }
}

fn scaled_away_from_zero(nanos: i128, unit: i128) -> i64 {
    let quotient = nanos / unit;
    let rounded = if nanos % unit == 0 {
        quotient
    } else if nanos > 0 {
        quotient + 1
    } else {
        quotient - 1
    };
    rounded.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn multiply_digits(digits: &mut Vec<u8>, factor: u32) {
    let mut carry: u32 = 0;
    for d in digits.iter_mut().rev() {
        let product = u32::from(*d) * factor + carry;
        *d = (product % 10) as u8;
        carry = product / 10;
    }
    while carry > 0 {
        digits.insert(0, (carry % 10) as u8);
        carry /= 10;
    }
}

fn increment_digits(digits: &mut Vec<u8>) {
    for d in digits.iter_mut().rev() {
        if *d == 9 {
            *d = 0;
        } else {
            *d += 1;
            return;
        }
    }
    digits.insert(0, 1);
}

// ------------------------------------------------------------------------------------------------
// Name and value formats (k8s.io/apimachinery/pkg/util/validation)
// ------------------------------------------------------------------------------------------------

fn is_dns1123_label_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// `IsDNS1123Subdomain`: at most 253 characters, dot-separated lower-case alphanumeric labels
/// that may contain '-' but not start or end with it. Returns the error messages.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !value.split('.').all(is_dns1123_label_part) {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character"
                .to_string(),
        );
    }
    errs
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `IsQualifiedName` (used by `ValidateLabelName` and for resource names): an optional DNS
/// subdomain prefix and '/', then a name of at most 63 characters.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for msg in dns1123_subdomain_errors(prefix) {
                    errs.push(format!("prefix part {msg}"));
                }
            }
            *name
        }
        _ => {
            errs.push(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and \
                 must start and end with an alphanumeric character, with an optional DNS \
                 subdomain prefix and '/'"
                    .to_string(),
            );
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !is_qualified_name_part(name) {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character"
                .to_string(),
        );
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 characters of `[-A-Za-z0-9_.]` starting and
/// ending with an alphanumeric character.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character"
                .to_string(),
        );
    }
    errs
}

// ------------------------------------------------------------------------------------------------
// Resource names (pkg/apis/core/helper/helpers.go, component-helpers/resource/helpers.go)
// ------------------------------------------------------------------------------------------------

const STANDARD_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "storage",
    "requests.storage",
    "services.nodeports",
    "services.loadbalancers",
];

const INTEGER_RESOURCES: &[&str] = &[
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
];

/// `IsHugePageResourceName`: the `hugepages-` prefix.
pub fn is_huge_page_resource(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// `IsNativeResource`: no '/' at all, or `kubernetes.io/` anywhere in the name (the Go code
/// uses `strings.Contains`, not a prefix test).
pub fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// `IsExtendedResourceName`: not native, not `requests.`-prefixed, and `requests.<name>` is a
/// qualified name.
pub fn is_extended_resource(name: &str) -> bool {
    if is_native_resource(name) || name.starts_with("requests.") {
        return false;
    }
    qualified_name_errors(&format!("requests.{name}")).is_empty()
}

/// `IsOvercommitAllowed` (§4.1): native and not hugepages. Hugepages and every extended
/// resource need request == limit.
pub fn is_overcommit_allowed(name: &str) -> bool {
    is_native_resource(name) && !is_huge_page_resource(name)
}

fn is_integer_resource(name: &str) -> bool {
    INTEGER_RESOURCES.contains(&name) || is_extended_resource(name)
}

fn is_standard_resource(name: &str) -> bool {
    STANDARD_RESOURCES.contains(&name)
        || name.starts_with("hugepages-")
        || name.starts_with("requests.hugepages-")
}

fn is_standard_container_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || is_huge_page_resource(name)
}

/// `IsSupportedPodLevelResource` (§4.1): cpu, memory and hugepages-*.
pub fn is_supported_pod_level_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || is_huge_page_resource(name)
}

/// `validateResourceName`.
fn resource_name_errors(name: &str, path: &str) -> Vec<String> {
    let msgs = qualified_name_errors(name);
    if !msgs.is_empty() {
        return msgs
            .into_iter()
            .map(|m| format!("{path}: Invalid value: {name:?}: {m}"))
            .collect();
    }
    if !name.contains('/') && !is_standard_resource(name) {
        return vec![format!(
            "{path}: Invalid value: {name:?}: must be a standard resource type or fully qualified"
        )];
    }
    Vec::new()
}

/// `validateContainerResourceName`.
fn container_resource_name_errors(name: &str, path: &str) -> Vec<String> {
    let mut errs = resource_name_errors(name, path);
    if !name.contains('/') {
        if !is_standard_container_resource(name) {
            errs.push(format!(
                "{path}: Invalid value: {name:?}: must be a standard resource for containers"
            ));
        }
    } else if !is_native_resource(name) && !is_extended_resource(name) {
        errs.push(format!(
            "{path}: Invalid value: {name:?}: doesn't follow extended resource name standard"
        ));
    }
    errs
}

/// `validatePodResourceName`.
fn pod_resource_name_errors(name: &str, path: &str) -> Vec<String> {
    let errs = resource_name_errors(name, path);
    if !errs.is_empty() {
        return errs;
    }
    if !is_supported_pod_level_resource(name) {
        return vec![format!(
            "{path}: Unsupported value: {name:?}: supported values: \"cpu\", \"hugepages-\", \"memory\""
        )];
    }
    Vec::new()
}

// ------------------------------------------------------------------------------------------------
// Small JSON helpers
// ------------------------------------------------------------------------------------------------

fn as_array(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(a)) => a,
        _ => &[],
    }
}

fn as_str(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

fn is_set(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null))
}

/// Pushes an error if `v` is present, not null, and not of the expected JSON type. The real
/// API server fails to decode such an object (400) before any validation runs.
fn expect_type(v: Option<&Value>, want: &str, path: &str, errs: &mut Vec<String>) {
    let ok = match v {
        None | Some(Value::Null) => true,
        Some(Value::Array(_)) => want == "array",
        Some(Value::Object(_)) => want == "object",
        Some(Value::String(_)) => want == "string",
        Some(Value::Number(_)) => want == "number",
        Some(Value::Bool(_)) => want == "boolean",
    };
    if !ok {
        errs.push(format!("{path}: Invalid type: expected {want}"));
    }
}

type ResourceList = BTreeMap<String, Quantity>;

/// Decodes a `ResourceList` map. Values are rounded up to milli-units, as
/// `SetDefaults_ResourceList` does on decode for every object (§4.2), so comparisons see what
/// the API server's validation sees.
fn resource_list(v: Option<&Value>, path: &str, errs: &mut Vec<String>) -> ResourceList {
    let mut out = ResourceList::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, raw) in map {
                match Quantity::from_json(raw) {
                    Ok(q) => {
                        out.insert(name.clone(), q.round_up_to_milli());
                    }
                    Err(e) => errs.push(format!("{path}[{name}]: Invalid value: {raw}: {e}")),
                }
            }
        }
        Some(_) => errs.push(format!("{path}: Invalid type: expected object")),
    }
    out
}

fn quiet_resource_list(v: Option<&Value>) -> ResourceList {
    resource_list(v, "", &mut Vec::new())
}

fn add_into(total: &mut ResourceList, list: &ResourceList) {
    for (name, q) in list {
        let entry = total.entry(name.clone()).or_insert(Quantity::ZERO);
        *entry = entry.checked_add(q).unwrap_or(*q);
    }
}

fn max_into(total: &mut ResourceList, list: &ResourceList) {
    for (name, q) in list {
        match total.get(name) {
            Some(existing) if existing >= q => {}
            _ => {
                total.insert(name.clone(), *q);
            }
        }
    }
}

fn is_sidecar(container: &Value) -> bool {
    container.get("restartPolicy").and_then(Value::as_str) == Some("Always")
}

/// `AggregateContainerRequests` / `AggregateContainerLimits` (component-helpers
/// `resource/helpers.go`, spec values only): the sum over regular containers and sidecars, or
/// the largest need of any init container (itself plus the sidecars started before it),
/// whichever is larger, per resource.
fn aggregate_containers(spec: &Value, field: &str) -> ResourceList {
    let list_of = |c: &Value| quiet_resource_list(c.get("resources").and_then(|r| r.get(field)));
    let mut result = ResourceList::new();
    for c in as_array(spec.get("containers")) {
        add_into(&mut result, &list_of(c));
    }
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for c in as_array(spec.get("initContainers")) {
        let own = list_of(c);
        let need = if is_sidecar(c) {
            add_into(&mut result, &own);
            add_into(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut combined = own;
            add_into(&mut combined, &sidecars);
            combined
        };
        max_into(&mut init_peak, &need);
    }
    max_into(&mut result, &init_peak);
    result
}

// ------------------------------------------------------------------------------------------------
// Where the pod spec lives
// ------------------------------------------------------------------------------------------------

/// The JSON Pointer of the pod spec inside an object of `kind`, if that kind carries one:
/// Pod `/spec`; Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, ReplicationController
/// `/spec/template/spec`; CronJob `/spec/jobTemplate/spec/template/spec`; PodTemplate
/// `/template/spec`.
pub fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController" => Some("/spec/template/spec"),
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        "PodTemplate" => Some("/template/spec"),
        _ => None,
    }
}

/// The pod spec of a Pod or of a workload's pod template (see [`pod_spec_pointer`]), or
/// `None` for other kinds or when the spec is missing.
pub fn pod_spec_of(object: &Value) -> Option<&Value> {
    let kind = object.get("kind")?.as_str()?;
    object.pointer(pod_spec_pointer(kind)?)
}

fn pod_spec_of_mut(object: &mut Value) -> Option<&mut Value> {
    let kind = object.get("kind")?.as_str()?.to_string();
    object.pointer_mut(pod_spec_pointer(&kind)?)
}

/// The field path of the pod spec for `kind`, in the API server's error notation
/// (`spec.template.spec`).
fn pod_spec_field_path(kind: &str) -> Option<String> {
    pod_spec_pointer(kind).map(|p| p.trim_start_matches('/').replace('/', "."))
}

// ------------------------------------------------------------------------------------------------
// Defaulting (§4.2)
// ------------------------------------------------------------------------------------------------

/// Rewrites every quantity in the spec's resource lists that is finer than a milli-unit to its
/// rounded-up milli value (`SetDefaults_ResourceList`, §4.2). Values already at milli
/// precision keep their original text.
fn round_resource_lists(spec: &mut Value) {
    fn round_map(map: Option<&mut Value>) {
        let Some(Value::Object(map)) = map else {
            return;
        };
        for raw in map.values_mut() {
            if let Ok(q) = Quantity::from_json(raw) {
                let rounded = q.round_up_to_milli();
                if rounded != q {
                    *raw = Value::String(rounded.to_string());
                }
            }
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(Value::Array(containers)) = spec.get_mut(list) {
            for c in containers {
                if let Some(res) = c.get_mut("resources") {
                    round_map(res.get_mut("requests"));
                    round_map(res.get_mut("limits"));
                }
            }
        }
    }
    if let Some(res) = spec.get_mut("resources") {
        round_map(res.get_mut("requests"));
        round_map(res.get_mut("limits"));
    }
    round_map(spec.get_mut("overhead"));
}

/// The resource defaulting of `SetDefaults_Pod` (`pkg/apis/core/v1/defaults.go`, §4.2). Only
/// for `kind: Pod`; other objects are left alone (pod templates are stored without it).
///
/// - For every container and init container with `limits`, each limit key absent from
///   `requests` gets `requests[key] = limit`. An explicit request (even "0") is kept.
/// - With PodLevelResources (on in 1.37): `defaultHugePagePodLimits`, `defaultPodRequests`
///   and `defaultPodLimits` fill pod-level `spec.resources` from the containers.
/// - Every resource quantity is rounded up to milli precision (`SetDefaults_ResourceList`).
///
/// The API server runs this when it decodes the Pod and again after every mutating webhook
/// patch (§4.2, §5.4). It is idempotent.
pub fn apply_pod_defaults(pod: &mut Value) {
    if pod.get("kind").and_then(Value::as_str) != Some("Pod") {
        return;
    }
    let Some(spec) = pod.get_mut("spec") else {
        return;
    };
    if !spec.is_object() {
        return;
    }
    round_resource_lists(spec);
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(containers)) = spec.get_mut(list) {
            for c in containers {
                default_container_requests(c);
            }
        }
    }
    default_huge_page_pod_limits(spec);
    default_pod_requests(spec);
    default_pod_limits(spec);
}

fn default_container_requests(container: &mut Value) {
    let Some(resources) = container
        .get_mut("resources")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let Some(Value::Object(limits)) = resources.get("limits") else {
        return;
    };
    let limits = limits.clone();
    let requests = resources
        .entry("requests")
        .or_insert_with(|| Value::Object(Map::new()));
    if requests.is_null() {
        *requests = Value::Object(Map::new());
    }
    if let Value::Object(requests) = requests {
        for (key, limit) in limits {
            requests.entry(key).or_insert(limit);
        }
    }
    // Go drops an empty map on output (omitempty); do the same.
    if resources
        .get("requests")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        resources.remove("requests");
    }
}

fn pod_resources_map<'a>(spec: &'a Value, field: &str) -> Option<&'a Map<String, Value>> {
    spec.get("resources")?.get(field)?.as_object()
}

fn set_pod_resources_map(spec: &mut Value, field: &str, map: Map<String, Value>) {
    if let Some(obj) = spec.as_object_mut() {
        let res = obj
            .entry("resources")
            .or_insert_with(|| Value::Object(Map::new()));
        if !res.is_object() {
            *res = Value::Object(Map::new());
        }
        if let Some(res) = res.as_object_mut() {
            res.insert(field.to_string(), Value::Object(map));
        }
    }
}

/// `defaultHugePagePodLimits`.
fn default_huge_page_pod_limits(spec: &mut Value) {
    if !is_set(spec.get("resources")) {
        return;
    }
    let limits = pod_resources_map(spec, "limits")
        .cloned()
        .unwrap_or_default();
    let requests = pod_resources_map(spec, "requests")
        .cloned()
        .unwrap_or_default();
    if limits.is_empty() && requests.is_empty() {
        return;
    }
    let mut new_limits = limits.clone();
    for (key, q) in aggregate_containers(spec, "limits") {
        if !is_supported_pod_level_resource(&key) || !is_huge_page_resource(&key) {
            continue;
        }
        if requests.contains_key(&key) {
            continue;
        }
        new_limits
            .entry(key)
            .or_insert_with(|| Value::String(q.to_string()));
    }
    if !new_limits.is_empty() && new_limits != limits {
        set_pod_resources_map(spec, "limits", new_limits);
    }
}

/// `defaultPodRequests`: only when pod-level limits are set.
fn default_pod_requests(spec: &mut Value) {
    let Some(limits) = pod_resources_map(spec, "limits").cloned() else {
        return;
    };
    if limits.is_empty() {
        return;
    }
    let requests = pod_resources_map(spec, "requests")
        .cloned()
        .unwrap_or_default();
    let mut new_requests = requests.clone();
    for (key, q) in aggregate_containers(spec, "requests") {
        if !new_requests.contains_key(&key)
            && is_supported_pod_level_resource(&key)
            && is_overcommit_allowed(&key)
        {
            new_requests.insert(key, Value::String(q.to_string()));
        }
    }
    for (key, limit) in &limits {
        if !new_requests.contains_key(key) && is_supported_pod_level_resource(key) {
            new_requests.insert(key.clone(), limit.clone());
        }
    }
    if !new_requests.is_empty() && new_requests != requests {
        set_pod_resources_map(spec, "requests", new_requests);
    }
}

/// `defaultPodLimits`: when pod-level requests but no pod-level limits are set, a supported,
/// overcommitable resource that every container limits gets the aggregate container limit.
fn default_pod_limits(spec: &mut Value) {
    let has_supported = |field: &str| {
        pod_resources_map(spec, field)
            .is_some_and(|m| m.keys().any(|k| is_supported_pod_level_resource(k)))
    };
    if has_supported("limits") || !has_supported("requests") {
        return;
    }
    let limits = pod_resources_map(spec, "limits")
        .cloned()
        .unwrap_or_default();
    let mut new_limits = limits.clone();
    let all_limit = |key: &str| {
        as_array(spec.get("containers"))
            .iter()
            .chain(as_array(spec.get("initContainers")))
            .all(|c| {
                c.get("resources")
                    .and_then(|r| r.get("limits"))
                    .and_then(|l| l.get(key))
                    .is_some()
            })
    };
    for (key, q) in aggregate_containers(spec, "limits") {
        if new_limits.contains_key(&key)
            || !is_supported_pod_level_resource(&key)
            || !is_overcommit_allowed(&key)
            || !all_limit(&key)
        {
            continue;
        }
        new_limits.insert(key, Value::String(q.to_string()));
    }
    if !new_limits.is_empty() && new_limits != limits {
        set_pod_resources_map(spec, "limits", new_limits);
    }
}

// ------------------------------------------------------------------------------------------------
// AdmissionReview responses (§5.2) and patch application (§5.4)
// ------------------------------------------------------------------------------------------------

/// `VerifyAdmissionResponse` (v1 branch) plus the dispatcher's patch-type and patch-decoding
/// checks (§5.2, §5.4), applied to the JSON body a webhook returned.
///
/// Checks: the body is `apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview`;
/// `response` is present; `response.uid == request_uid`; `allowed` is present and a boolean;
/// for a mutating webhook `patch` and `patchType` come together, `patchType` is
/// `"JSONPatch"`, and `patch` is a standard (padded) base64 string that decodes to a JSON
/// array of operations; a validating webhook returns neither. Fields present with the wrong
/// JSON type are decode errors, as in the API server.
///
/// Stricter than the API server on purpose in two places (podmend must be unambiguous):
/// a missing `allowed` is an error (Go would read it as `false`, a denial), and `patch` must be
/// a base64 string: Go's `[]byte` decoder would also accept a JSON array of byte values
/// (kube-core's serialisation), which no other client expects.
///
/// Returns the decoded patch bytes, or `None` when the response carries no patch.
pub fn verify_admission_response(
    request_uid: &str,
    body: &Value,
    mutating: bool,
) -> Result<Option<Vec<u8>>, String> {
    let response = admission_response(request_uid, body)?;
    check_response_field_types(response)?;
    let (patch, patch_type) = patch_and_type(response)?;
    if !mutating {
        if !patch.is_empty() {
            return Err("validating webhook may not return response.patch".to_string());
        }
        if patch_type.is_some() {
            return Err("validating webhook may not return response.patchType".to_string());
        }
        return Ok(None);
    }
    if !patch.is_empty() && patch_type.is_none() {
        return Err("webhook returned response.patch but not response.patchType".to_string());
    }
    if patch.is_empty() && patch_type.is_some() {
        return Err("webhook returned response.patchType but not response.patch".to_string());
    }
    match patch_type {
        None => return Ok(None),
        Some("") => return Err("webhook returned invalid response.patchType of \"\"".to_string()),
        Some("JSONPatch") => {}
        Some(other) => return Err(format!("unsupported patch type {other:?}")),
    }
    decode_json_patch(&patch)?;
    Ok(Some(patch))
}

/// The `response` of an AdmissionReview answering the request `request_uid`, once its
/// envelope (`apiVersion`, `kind`), `uid` and `allowed` are as the API server requires.
fn admission_response<'a>(
    request_uid: &str,
    body: &'a Value,
) -> Result<&'a serde_json::Map<String, Value>, String> {
    let Some(body) = body.as_object() else {
        return Err("webhook response body is not a JSON object".to_string());
    };
    let api_version = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    let response = match body.get("response") {
        None | Some(Value::Null) => return Err("webhook response was absent".to_string()),
        Some(Value::Object(r)) => r,
        Some(other) => {
            return Err(format!(
                "response: cannot decode {other} into AdmissionResponse"
            ));
        }
    };
    let uid = match response.get("uid") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(other) => return Err(format!("response.uid: cannot decode {other} into a string")),
    };
    if uid != request_uid {
        return Err(format!(
            "expected response.uid={request_uid:?}, got {uid:?}"
        ));
    }
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        let group_version = api_version
            .split_once('/')
            .map_or((String::new(), api_version.to_string()), |(g, v)| {
                (g.to_string(), v.to_string())
            });
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}/{}, Kind={kind}",
            group_version.0, group_version.1
        ));
    }
    match response.get("allowed") {
        Some(Value::Bool(_)) => {}
        None => {
            return Err(
                "response.allowed is missing (the API server would read it as false, a denial)"
                    .to_string(),
            );
        }
        Some(other) => {
            return Err(format!(
                "response.allowed: cannot decode {other} into a bool"
            ));
        }
    }
    Ok(response)
}

/// The optional fields of a response, when present, have the JSON types the API server
/// decodes them into; the first that does not is the error.
fn check_response_field_types(response: &serde_json::Map<String, Value>) -> Result<(), String> {
    let mut decode_errs = Vec::new();
    expect_type(
        response.get("warnings"),
        "array",
        "response.warnings",
        &mut decode_errs,
    );
    expect_type(
        response.get("auditAnnotations"),
        "object",
        "response.auditAnnotations",
        &mut decode_errs,
    );
    expect_type(
        response.get("status"),
        "object",
        "response.status",
        &mut decode_errs,
    );
    for (i, w) in as_array(response.get("warnings")).iter().enumerate() {
        expect_type(
            Some(w),
            "string",
            &format!("response.warnings[{i}]"),
            &mut decode_errs,
        );
    }
    if let Some(Value::Object(annotations)) = response.get("auditAnnotations") {
        for (k, v) in annotations {
            expect_type(
                Some(v),
                "string",
                &format!("response.auditAnnotations[{k}]"),
                &mut decode_errs,
            );
        }
    }
    match decode_errs.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The response's patch, base64-decoded (empty when absent), and its `patchType`.
fn patch_and_type(
    response: &serde_json::Map<String, Value>,
) -> Result<(Vec<u8>, Option<&str>), String> {
    let patch: Vec<u8> = match response.get("patch") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            decode_go_base64(s).map_err(|e| format!("response.patch: illegal base64 data: {e}"))?
        }
        Some(Value::Array(_)) => {
            return Err(
                "response.patch is a JSON array of numbers, not a base64 string (kube-core's \
                 serialisation of Vec<u8>); podmend must send base64"
                    .to_string(),
            );
        }
        Some(other) => return Err(format!("response.patch: cannot decode {other} into []byte")),
    };
    let patch_type = match response.get("patchType") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => {
            return Err(format!(
                "response.patchType: cannot decode {other} into a string"
            ));
        }
    };

    Ok((patch, patch_type))
}

/// Go's `encoding/json` decoding of a `[]byte` from a JSON string: `base64.StdEncoding.Decode`,
/// which requires padding, ignores '\r' and '\n', and tolerates non-zero trailing bits.
fn decode_go_base64(s: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let cleaned: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    GO_STD.decode(cleaned).map_err(|e| e.to_string())
}

/// `jsonpatch.DecodePatch` (evanphx/json-patch v4): the bytes must be a JSON array of
/// operation objects.
fn decode_json_patch(bytes: &[u8]) -> Result<json_patch::Patch, String> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("received undecodable patch in webhook response: {e}"))?;
    let Some(ops) = value.as_array() else {
        return Err("received undecodable patch in webhook response: not a JSON array".to_string());
    };
    if let Some(bad) = ops.iter().find(|op| !op.is_object()) {
        return Err(format!(
            "received undecodable patch in webhook response: operation {bad} is not an object"
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| format!("received undecodable patch in webhook response: {e}"))
}

/// What the mutating dispatcher does with a verified patch (§5.4): decode it (error: "received
/// undecodable patch"), apply it (a path that does not exist for `replace`/`remove`/`test` is
/// an InternalError), and re-default the result. An empty patch or `[]` changes nothing.
///
/// Defaulting: for `kind: Pod` [`apply_pod_defaults`]; for every kind with a pod spec the
/// milli-rounding of `SetDefaults_ResourceList`. It is applied even for an empty patch: it is
/// idempotent, and the API server had already defaulted the object on decode.
pub fn apply_patch_as_api_server(object: &Value, patch_bytes: &[u8]) -> Result<Value, String> {
    let mut patched = object.clone();
    if !patch_bytes.is_empty() {
        let patch = decode_json_patch(patch_bytes)?;
        json_patch::patch(&mut patched, &patch)
            .map_err(|e| format!("Internal error occurred: {e}"))?;
        if !patched.is_object() {
            return Err(
                "Internal error occurred: the patched object is not a JSON object".to_string(),
            );
        }
    }
    if let Some(spec) = pod_spec_of_mut(&mut patched) {
        round_resource_lists(spec);
    }
    apply_pod_defaults(&mut patched);
    Ok(patched)
}

// ------------------------------------------------------------------------------------------------
// Pod spec validation (§1, §3.4, §4.1)
// ------------------------------------------------------------------------------------------------

/// `ValidatePodSpec` (and `ValidatePodCreate`'s nodeName rule), limited to the fields podmend
/// touches. Errors are prefixed with their field path, starting at `spec`.
///
/// - Required node affinity (§1.1-§1.3): `nodeSelectorTerms` must be non-empty (an empty term
///   `{}` is valid); matchExpressions operators and values; matchFields only
///   `metadata.name`, `In`/`NotIn`, exactly one value, a DNS-1123 subdomain. Preferred terms:
///   weight 1..100, same term rules except label values.
/// - `nodeName` (§3.4): a DNS-1123 subdomain, and not together with `schedulingGates`.
/// - Container and init container resources (§4.1): names, non-negative quantities, integer
///   extended resources, request ≤ limit (== for hugepages and extended resources, which also
///   need a limit), hugepage sizes, hugepages need cpu or memory.
/// - Pod-level `spec.resources` (§4.1): only cpu/memory/hugepages-*, no claims, pod requests ≥
///   aggregate container requests, each container limit ≤ the pod limit.
/// - Tolerations: key, operator/value, effect, tolerationSeconds only with NoExecute.
///
/// Pass a Pod's spec after [`apply_pod_defaults`] (the API server validates the defaulted
/// object), or use [`validate_pod_spec_with_defaults`] / [`validate_object`].
pub fn validate_pod_spec(spec: &Value) -> Vec<String> {
    validate_pod_spec_at(spec, "spec")
}

/// [`validate_pod_spec`] with the field paths rooted at `path` (e.g. `spec.template.spec`).
pub fn validate_pod_spec_at(spec: &Value, path: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if !spec.is_object() {
        errs.push(format!("{path}: Invalid type: expected object"));
        return errs;
    }
    validate_node_name(spec, path, &mut errs);
    validate_affinity(spec, path, &mut errs);
    for list in ["containers", "initContainers"] {
        let list_path = format!("{path}.{list}");
        expect_type(spec.get(list), "array", &list_path, &mut errs);
        for (i, c) in as_array(spec.get(list)).iter().enumerate() {
            let res_path = format!("{list_path}[{i}].resources");
            match c.get("resources") {
                None | Some(Value::Null) => {}
                Some(res @ Value::Object(_)) => validate_resource_requirements(
                    res,
                    &res_path,
                    ResourceScope::Container,
                    &mut errs,
                ),
                Some(_) => errs.push(format!("{res_path}: Invalid type: expected object")),
            }
        }
    }
    validate_pod_level_resources(spec, path, &mut errs);
    validate_tolerations(spec, path, &mut errs);
    errs
}

/// Wraps `spec` in a Pod, applies [`apply_pod_defaults`], and validates the result: what the
/// API server does with a Pod CREATE carrying this spec.
pub fn validate_pod_spec_with_defaults(spec: &Value) -> Vec<String> {
    let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "spec": spec});
    apply_pod_defaults(&mut pod);
    validate_pod_spec(&pod["spec"])
}

/// Validates the pod spec inside any object that has one ([`pod_spec_of`]), with field paths
/// as the API server reports them (`spec.template.spec...`). Pods are defaulted first
/// ([`apply_pod_defaults`]); templates are not (§4.2). Other kinds give no errors.
pub fn validate_object(object: &Value) -> Vec<String> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(path) = pod_spec_field_path(kind) else {
        return Vec::new();
    };
    let mut object = object.clone();
    apply_pod_defaults(&mut object);
    match pod_spec_of(&object) {
        Some(spec) => validate_pod_spec_at(spec, &path),
        None => vec![format!("{path}: Required value")],
    }
}

fn validate_node_name(spec: &Value, path: &str, errs: &mut Vec<String>) {
    let node_name_path = format!("{path}.nodeName");
    expect_type(spec.get("nodeName"), "string", &node_name_path, errs);
    let node_name = as_str(spec.get("nodeName"));
    if !node_name.is_empty() {
        for msg in dns1123_subdomain_errors(node_name) {
            errs.push(format!(
                "{node_name_path}: Invalid value: {node_name:?}: {msg}"
            ));
        }
        // ValidatePodCreate (§3.4).
        if !as_array(spec.get("schedulingGates")).is_empty() {
            errs.push(format!(
                "{node_name_path}: Forbidden: cannot be set until all schedulingGates have been cleared"
            ));
        }
    }
}

fn validate_affinity(spec: &Value, path: &str, errs: &mut Vec<String>) {
    let Some(node_affinity) = spec.get("affinity").and_then(|a| a.get("nodeAffinity")) else {
        return;
    };
    if node_affinity.is_null() {
        return;
    }
    let na_path = format!("{path}.affinity.nodeAffinity");
    let required_path = format!("{na_path}.requiredDuringSchedulingIgnoredDuringExecution");
    let required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution");
    if is_set(required) {
        // ValidateNodeSelector (§1.3).
        let required = required.unwrap_or(&Value::Null);
        let terms_path = format!("{required_path}.nodeSelectorTerms");
        expect_type(
            required.get("nodeSelectorTerms"),
            "array",
            &terms_path,
            errs,
        );
        let terms = as_array(required.get("nodeSelectorTerms"));
        if terms.is_empty() {
            errs.push(format!(
                "{terms_path}: Required value: must have at least one node selector term"
            ));
        }
        for (i, term) in terms.iter().enumerate() {
            validate_node_selector_term(term, false, &format!("{terms_path}[{i}]"), errs);
        }
    }
    let preferred_path = format!("{na_path}.preferredDuringSchedulingIgnoredDuringExecution");
    expect_type(
        node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"),
        "array",
        &preferred_path,
        errs,
    );
    for (i, term) in as_array(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))
        .iter()
        .enumerate()
    {
        // ValidatePreferredSchedulingTerms (§1.3).
        let weight = term.get("weight").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=100).contains(&weight) {
            errs.push(format!(
                "{preferred_path}[{i}].weight: Invalid value: {weight}: must be in the range 1-100"
            ));
        }
        let preference = term.get("preference").unwrap_or(&Value::Null);
        validate_node_selector_term(
            preference,
            true,
            &format!("{preferred_path}[{i}].preference"),
            errs,
        );
    }
}

/// `ValidateNodeSelectorTerm`: no check for an empty term (§1.3).
fn validate_node_selector_term(
    term: &Value,
    allow_invalid_label_values: bool,
    path: &str,
    errs: &mut Vec<String>,
) {
    expect_type(Some(term), "object", path, errs);
    for field in ["matchExpressions", "matchFields"] {
        expect_type(term.get(field), "array", &format!("{path}.{field}"), errs);
    }
    for (j, req) in as_array(term.get("matchExpressions")).iter().enumerate() {
        validate_node_selector_requirement(
            req,
            allow_invalid_label_values,
            &format!("{path}.matchExpressions[{j}]"),
            errs,
        );
    }
    for (j, req) in as_array(term.get("matchFields")).iter().enumerate() {
        validate_node_field_selector_requirement(req, &format!("{path}.matchFields[{j}]"), errs);
    }
}

fn requirement_values(req: &Value, path: &str, errs: &mut Vec<String>) -> Vec<String> {
    let values_path = format!("{path}.values");
    expect_type(req.get("values"), "array", &values_path, errs);
    let mut out = Vec::new();
    for (i, v) in as_array(req.get("values")).iter().enumerate() {
        match v.as_str() {
            Some(s) => out.push(s.to_string()),
            None => errs.push(format!("{values_path}[{i}]: Invalid type: expected string")),
        }
    }
    out
}

/// `ValidateNodeSelectorRequirement` (§1.1).
fn validate_node_selector_requirement(
    req: &Value,
    allow_invalid_label_values: bool,
    path: &str,
    errs: &mut Vec<String>,
) {
    let values = requirement_values(req, path, errs);
    let operator = as_str(req.get("operator"));
    match operator {
        "In" | "NotIn" => {
            if values.is_empty() {
                errs.push(format!(
                    "{path}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                ));
            }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                errs.push(format!(
                    "{path}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                ));
            }
        }
        "Gt" | "Lt" => {
            if values.len() != 1 {
                errs.push(format!(
                    "{path}.values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
                ));
            }
        }
        other => errs.push(format!(
            "{path}.operator: Invalid value: {other:?}: not a valid selector operator"
        )),
    }
    let key = as_str(req.get("key"));
    for msg in qualified_name_errors(key) {
        errs.push(format!("{path}.key: Invalid value: {key:?}: {msg}"));
    }
    if !allow_invalid_label_values {
        for (i, value) in values.iter().enumerate() {
            for msg in label_value_errors(value) {
                errs.push(format!(
                    "{path}.values[{i}]: Invalid value: {value:?}: {msg}"
                ));
            }
        }
    }
}

/// `ValidateNodeFieldSelectorRequirement` (§1.2).
fn validate_node_field_selector_requirement(req: &Value, path: &str, errs: &mut Vec<String>) {
    let values = requirement_values(req, path, errs);
    let operator = as_str(req.get("operator"));
    match operator {
        "In" | "NotIn" => {
            if values.len() != 1 {
                errs.push(format!(
                    "{path}.values: Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector"
                ));
            }
        }
        other => errs.push(format!(
            "{path}.operator: Invalid value: {other:?}: not a valid selector operator"
        )),
    }
    let key = as_str(req.get("key"));
    if key != "metadata.name" {
        errs.push(format!(
            "{path}.key: Invalid value: {key:?}: not a valid field selector key"
        ));
    } else {
        for (i, value) in values.iter().enumerate() {
            for msg in dns1123_subdomain_errors(value) {
                errs.push(format!(
                    "{path}.values[{i}]: Invalid value: {value:?}: {msg}"
                ));
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ResourceScope {
    Container,
    Pod,
}

/// `validateResourceRequirements` (§4.1), shared by containers and the pod level.
fn validate_resource_requirements(
    resources: &Value,
    path: &str,
    scope: ResourceScope,
    errs: &mut Vec<String>,
) {
    let lim_path = format!("{path}.limits");
    let req_path = format!("{path}.requests");
    let limits = resource_list(resources.get("limits"), &lim_path, errs);
    let requests = resource_list(resources.get("requests"), &req_path, errs);
    let name_errors = |name: &str, p: &str| match scope {
        ResourceScope::Container => container_resource_name_errors(name, p),
        ResourceScope::Pod => pod_resource_name_errors(name, p),
    };
    let mut cpu_or_memory = false;
    let mut huge_pages = false;
    for (name, q) in &limits {
        let p = format!("{lim_path}[{name}]");
        errs.extend(name_errors(name, &p));
        quantity_value_errors(name, q, &p, errs);
        if is_huge_page_resource(name) {
            huge_pages = true;
            huge_page_value_errors(name, q, &p, errs);
        }
        cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
    }
    for (name, q) in &requests {
        let p = format!("{req_path}[{name}]");
        errs.extend(name_errors(name, &p));
        quantity_value_errors(name, q, &p, errs);
        match limits.get(name) {
            Some(limit) => {
                if q != limit && !is_overcommit_allowed(name) {
                    errs.push(format!(
                        "{req_path}: Invalid value: \"{q}\": must be equal to {name} limit of {limit}"
                    ));
                } else if q > limit {
                    errs.push(format!(
                        "{req_path}: Invalid value: \"{q}\": must be less than or equal to {name} limit of {limit}"
                    ));
                }
            }
            None => {
                if !is_overcommit_allowed(name) {
                    errs.push(format!(
                        "{lim_path}: Required value: Limit must be set for non overcommitable resources"
                    ));
                }
            }
        }
        if is_huge_page_resource(name) {
            huge_pages = true;
            huge_page_value_errors(name, q, &p, errs);
        }
        cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
    }
    if huge_pages && !cpu_or_memory {
        errs.push(format!(
            "{path}: Forbidden: HugePages require cpu or memory"
        ));
    }
}

/// `ValidateResourceQuantityValue`: non-negative; integer resources have whole values.
fn quantity_value_errors(name: &str, q: &Quantity, path: &str, errs: &mut Vec<String>) {
    if q.sign() < 0 {
        errs.push(format!(
            "{path}: Invalid value: \"{q}\": must be greater than or equal to 0"
        ));
    }
    if is_integer_resource(name) && q.milli_value() % 1000 != 0 {
        errs.push(format!(
            "{path}: Invalid value: \"{q}\": must be an integer"
        ));
    }
}

/// `validateResourceQuantityHugePageValue` / `IsHugePageResourceValueDivisible`: the value is
/// a whole multiple of the page size named in the resource.
fn huge_page_value_errors(name: &str, q: &Quantity, path: &str, errs: &mut Vec<String>) {
    let divisible = match Quantity::parse(&name["hugepages-".len()..]) {
        Ok(page) if page.sign() > 0 && page.milli_value() % 1000 == 0 => {
            q.value() % page.value() == 0
        }
        _ => false,
    };
    if !divisible {
        errs.push(format!(
            "{path}: Invalid value: \"{q}\": {q} is not positive integer multiple of {name}"
        ));
    }
}

/// `validatePodResources` + `validatePodResourceConsistency` (§4.1). Like Kubernetes ≥ 1.33
/// (kubernetes/kubernetes#130131, fixing #132449) the aggregate-request rule only looks at
/// resources supported at pod level.
fn validate_pod_level_resources(spec: &Value, path: &str, errs: &mut Vec<String>) {
    let res_path = format!("{path}.resources");
    let resources = match spec.get("resources") {
        None | Some(Value::Null) => return,
        Some(r @ Value::Object(_)) => r,
        Some(_) => {
            errs.push(format!("{res_path}: Invalid type: expected object"));
            return;
        }
    };
    if is_set(resources.get("claims")) {
        errs.push(format!(
            "{res_path}.claims: Forbidden: claims cannot be set for Resources at pod-level"
        ));
    }
    validate_resource_requirements(resources, &res_path, ResourceScope::Pod, errs);

    let pod_requests = quiet_resource_list(resources.get("requests"));
    let pod_limits = quiet_resource_list(resources.get("limits"));
    for (name, aggregate) in aggregate_containers(spec, "requests") {
        if !is_supported_pod_level_resource(&name) {
            continue;
        }
        let pod_request = pod_requests.get(&name).copied().unwrap_or(Quantity::ZERO);
        if aggregate > pod_request {
            errs.push(format!(
                "{res_path}.requests[{name}]: Invalid value: \"{pod_request}\": must be greater than or equal to aggregate container requests of {aggregate}"
            ));
        }
    }
    for (i, c) in as_array(spec.get("containers")).iter().enumerate() {
        let limits = quiet_resource_list(c.get("resources").and_then(|r| r.get("limits")));
        for (name, limit) in limits {
            if let Some(pod_limit) = pod_limits.get(&name)
                && limit > *pod_limit
            {
                errs.push(format!(
                    "{res_path}.containers[{i}][{name}].limits: Invalid value: \"{limit}\": must be less than or equal to pod limits of {pod_limit}"
                ));
            }
        }
    }
}

/// `ValidateTolerations`.
fn validate_tolerations(spec: &Value, path: &str, errs: &mut Vec<String>) {
    let tol_path = format!("{path}.tolerations");
    expect_type(spec.get("tolerations"), "array", &tol_path, errs);
    for (i, t) in as_array(spec.get("tolerations")).iter().enumerate() {
        let p = format!("{tol_path}[{i}]");
        let key = as_str(t.get("key"));
        let operator = as_str(t.get("operator"));
        let value = as_str(t.get("value"));
        let effect = as_str(t.get("effect"));
        if !key.is_empty() {
            for msg in qualified_name_errors(key) {
                errs.push(format!("{p}.key: Invalid value: {key:?}: {msg}"));
            }
        }
        if key.is_empty() && operator != "Exists" {
            errs.push(format!(
                "{p}.operator: Invalid value: {operator:?}: operator must be Exists when `key` is empty, which means \"match all values and all keys\""
            ));
        }
        if is_set(t.get("tolerationSeconds")) && effect != "NoExecute" {
            errs.push(format!(
                "{p}.effect: Invalid value: {effect:?}: effect must be 'NoExecute' when `tolerationSeconds` is set"
            ));
        }
        match operator {
            "Equal" | "" => {
                let msgs = label_value_errors(value);
                if !msgs.is_empty() {
                    errs.push(format!(
                        "{p}.operator: Invalid value: {value:?}: {}",
                        msgs.join(";")
                    ));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errs.push(format!(
                        "{p}.operator: Invalid value: {value:?}: value must be empty when `operator` is 'Exists'"
                    ));
                }
            }
            other => errs.push(format!(
                "{p}.operator: Unsupported value: {other:?}: supported values: \"Equal\", \"Exists\""
            )),
        }
        if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            errs.push(format!(
                "{p}.effect: Unsupported value: {effect:?}: supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
            ));
        }
    }
}

// ------------------------------------------------------------------------------------------------
// QoS (§4.3)
// ------------------------------------------------------------------------------------------------

/// `ComputePodQOS` (§4.3) for the Pod that the API server would store with this spec: the
/// spec is first defaulted as a Pod ([`apply_pod_defaults`], so limits-only containers get
/// requests). Returns "Guaranteed", "Burstable" or "BestEffort".
///
/// Pod-level path: when `spec.resources` sets cpu, memory or hugepages (PodLevelResources on,
/// `isPodLevelResourcesSet`), only the pod-level requests and limits count. Otherwise every
/// container and init container counts. Only cpu and memory quantities greater than zero are
/// summed; both sums empty is BestEffort; Guaranteed needs positive cpu and memory limits
/// everywhere (at pod level: in the pod limits), requests equal to limits, and as many
/// request entries as limit entries.
pub fn qos_class(spec: &Value) -> &'static str {
    let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "spec": spec});
    apply_pod_defaults(&mut pod);
    let spec = &pod["spec"];

    let positive_qos = |list: &ResourceList| -> ResourceList {
        list.iter()
            .filter(|(name, q)| matches!(name.as_str(), "cpu" | "memory") && q.sign() > 0)
            .map(|(n, q)| (n.clone(), *q))
            .collect()
    };
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    let mut guaranteed = true;

    let pod_level_set = ["requests", "limits"].iter().any(|field| {
        pod_resources_map(spec, field)
            .is_some_and(|m| m.keys().any(|k| is_supported_pod_level_resource(k)))
    });
    if pod_level_set {
        let pod_requests = quiet_resource_list(spec["resources"].get("requests"));
        let pod_limits = quiet_resource_list(spec["resources"].get("limits"));
        add_into(&mut requests, &positive_qos(&pod_requests));
        if !pod_limits.is_empty() {
            let found = positive_qos(&pod_limits);
            add_into(&mut limits, &found);
            if !(found.contains_key("cpu") && found.contains_key("memory")) {
                guaranteed = false;
            }
        }
    } else {
        for c in as_array(spec.get("containers"))
            .iter()
            .chain(as_array(spec.get("initContainers")))
        {
            let res = c.get("resources");
            add_into(
                &mut requests,
                &positive_qos(&quiet_resource_list(res.and_then(|r| r.get("requests")))),
            );
            let found = positive_qos(&quiet_resource_list(res.and_then(|r| r.get("limits"))));
            add_into(&mut limits, &found);
            if !(found.contains_key("cpu") && found.contains_key("memory")) {
                guaranteed = false;
            }
        }
    }

    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed
        && requests
            .iter()
            .all(|(name, req)| limits.get(name).is_some_and(|lim| lim == req))
        && requests.len() == limits.len()
    {
        return "Guaranteed";
    }
    "Burstable"
}

// ------------------------------------------------------------------------------------------------
// LimitRanger (§4.5)
// ------------------------------------------------------------------------------------------------

/// `requestLimitEnforcedValues`: `Value()`s, or `MilliValue()`s when all three fit.
fn request_limit_enforced_values(
    request: Option<&Quantity>,
    limit: Option<&Quantity>,
    enforced: &Quantity,
) -> (i64, i64, i64) {
    let zero = Quantity::ZERO;
    let (request, limit) = (request.unwrap_or(&zero), limit.unwrap_or(&zero));
    let (r, l, e) = (request.value(), limit.value(), enforced.value());
    if r <= MAX_MILLI_VALUE && l <= MAX_MILLI_VALUE && e <= MAX_MILLI_VALUE {
        (
            request.milli_value(),
            limit.milli_value(),
            enforced.milli_value(),
        )
    } else {
        (r, l, e)
    }
}

fn min_constraint(
    limit_type: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let (req, lim) = (requests.get(name), limits.get(name));
    let (r, l, e) = request_limit_enforced_values(req, lim, enforced);
    match (req, lim) {
        (None, _) => Some(format!(
            "minimum {name} usage per {limit_type} is {enforced}.  No request is specified"
        )),
        (Some(req), _) if r < e => Some(format!(
            "minimum {name} usage per {limit_type} is {enforced}, but request is {req}"
        )),
        (_, Some(lim)) if l < e => Some(format!(
            "minimum {name} usage per {limit_type} is {enforced}, but limit is {lim}"
        )),
        _ => None,
    }
}

fn max_constraint(
    limit_type: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let (req, lim) = (requests.get(name), limits.get(name));
    let (r, l, e) = request_limit_enforced_values(req, lim, enforced);
    match (req, lim) {
        (_, None) => Some(format!(
            "maximum {name} usage per {limit_type} is {enforced}.  No limit is specified"
        )),
        (_, Some(lim)) if l > e => Some(format!(
            "maximum {name} usage per {limit_type} is {enforced}, but limit is {lim}"
        )),
        (Some(req), _) if r > e => Some(format!(
            "maximum {name} usage per {limit_type} is {enforced}, but request is {req}"
        )),
        _ => None,
    }
}

/// `limitRequestRatioConstraint`, including its float comparison: the observed ratio of the
/// (milli) values, times 1000, against the enforced ratio's milli-value.
fn limit_request_ratio_constraint(
    limit_type: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let (req, lim) = (requests.get(name), limits.get(name));
    let (r, l, _) = request_limit_enforced_values(req, lim, enforced);
    if req.is_none() || r == 0 {
        return Some(format!(
            "{name} max limit to request ratio per {limit_type} is {enforced}, but no request is specified or request is 0"
        ));
    }
    if lim.is_none() || l == 0 {
        return Some(format!(
            "{name} max limit to request ratio per {limit_type} is {enforced}, but no limit is specified or limit is 0"
        ));
    }
    let mut observed_ratio = l as f64 / r as f64;
    let display_ratio = observed_ratio;
    let mut max_ratio = enforced.value() as f64;
    if enforced.value() <= MAX_MILLI_VALUE {
        observed_ratio *= 1000.0;
        max_ratio = enforced.milli_value() as f64;
    }
    if observed_ratio > max_ratio {
        return Some(format!(
            "{name} max limit to request ratio per {limit_type} is {enforced}, but provided ratio is {display_ratio:.6}"
        ));
    }
    None
}

/// `podRequests` / `podLimits` of the LimitRanger: the sidecar-aware aggregate of the
/// containers, overridden by pod-level values of supported resources (PodLevelResources on).
fn limit_ranger_pod_totals(spec: &Value, field: &str) -> ResourceList {
    let mut totals = aggregate_containers(spec, field);
    if let Some(res) = spec.get("resources").filter(|r| r.is_object()) {
        for (name, q) in quiet_resource_list(res.get(field)) {
            if is_supported_pod_level_resource(&name) {
                totals.insert(name, q);
            }
        }
    }
    totals
}

/// `PodValidateLimitFunc` (§4.5): the LimitRanger's validation, run after all mutating
/// admission (webhooks included). `items` are `LimitRangeItem`s (the entries of a
/// LimitRange's `spec.limits`); whole `LimitRange` objects are accepted too and expanded.
///
/// - `type: Container`, for each container and init container: `min` (request missing or below
///   min, limit below min), `max` (limit missing or above max, request above max),
///   `maxLimitRequestRatio` (request missing or 0, limit missing or 0, ratio above the maximum,
///   compared exactly as the Go code does in float64).
/// - `type: Pod`: the same checks on the pod's total requests and limits.
///
/// Values are compared as `MilliValue()`s (or `Value()`s when too large). Pass a defaulted Pod
/// spec. Returns the error messages; any error means 403 Forbidden.
pub fn limit_ranger_validate(spec: &Value, items: &[Value]) -> Vec<String> {
    let mut expanded: Vec<&Value> = Vec::new();
    for item in items {
        if item.get("kind").and_then(Value::as_str) == Some("LimitRange") {
            expanded.extend(as_array(item.pointer("/spec/limits")));
        } else {
            expanded.push(item);
        }
    }
    let mut errs = Vec::new();
    for item in expanded {
        let limit_type = as_str(item.get("type"));
        let min = quiet_resource_list(item.get("min"));
        let max = quiet_resource_list(item.get("max"));
        let ratio = quiet_resource_list(item.get("maxLimitRequestRatio"));
        let mut check = |requests: &ResourceList, limits: &ResourceList| {
            for (name, q) in &min {
                errs.extend(min_constraint(limit_type, name, q, requests, limits));
            }
            for (name, q) in &max {
                errs.extend(max_constraint(limit_type, name, q, requests, limits));
            }
            for (name, q) in &ratio {
                errs.extend(limit_request_ratio_constraint(
                    limit_type, name, q, requests, limits,
                ));
            }
        };
        match limit_type {
            "Container" => {
                for c in as_array(spec.get("containers"))
                    .iter()
                    .chain(as_array(spec.get("initContainers")))
                {
                    let res = c.get("resources");
                    let requests = quiet_resource_list(res.and_then(|r| r.get("requests")));
                    let limits = quiet_resource_list(res.and_then(|r| r.get("limits")));
                    check(&requests, &limits);
                }
            }
            "Pod" => {
                let requests = limit_ranger_pod_totals(spec, "requests");
                let limits = limit_ranger_pod_totals(spec, "limits");
                check(&requests, &limits);
            }
            _ => {}
        }
    }
    errs
}

// ------------------------------------------------------------------------------------------------
// Quantity ordering helper for callers
// ------------------------------------------------------------------------------------------------

/// Compares two quantity strings exactly (`Quantity.Cmp`). Errors if either does not parse.
pub fn compare_quantities(a: &str, b: &str) -> Result<Ordering, String> {
    Ok(Quantity::parse(a)?.cmp(&Quantity::parse(b)?))
}

// ------------------------------------------------------------------------------------------------
// UPDATE of pods/status (§6.1)
// ------------------------------------------------------------------------------------------------

/// Pod condition types that `validatePodConditions` skips: every other type must be a
/// qualified name.
const SYSTEM_POD_CONDITIONS: &[&str] = &["PodScheduled", "Ready", "Initialized"];

/// `core.MirrorPodAnnotationKey`: may not be added, removed or changed on update (§8.1).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// `TotalAnnotationSizeLimitB` of `ValidateAnnotations`: 256 KiB over all keys and values.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// What the API server does after the mutating webhooks on an UPDATE of pods/status (§6.1):
/// podStatusStrategy.PrepareForUpdate on `new` against `old`, then ValidatePodStatusUpdate.
/// Returns the Pod as it would be stored, or the validation errors.
///
/// `old` is the stored Pod (already defaulted, as every stored Pod is); `new` is the object
/// after the last mutating webhook. Order, as in `rest.BeforeUpdate`
/// (`staging/src/k8s.io/apiserver/pkg/registry/rest/update.go`, §5.8):
///
/// 1. `podStatusStrategy.PrepareForUpdate` (`pkg/registry/core/pod/strategy.go`):
///    - `spec` := old `spec`. **Every spec edit is discarded**, silently.
///    - `metadata.deletionTimestamp` := nil, and `metadata.ownerReferences` := old's.
///    - an empty `status.qosClass` is backfilled from old.
///    - `preserveOldObservedGeneration`: a zero/absent `status.observedGeneration` takes old's;
///      each condition with a zero/absent `observedGeneration` takes the one of the old
///      condition of the same type (matched in order, one old condition per new one).
///    - `podutil.DropDisabledPodFields` is not modelled (alpha gates are off, see the top).
/// 2. `BeforeUpdate`'s own metadata rules: `generation` := old's; an empty `uid` := old's;
///    `creationTimestamp` := old's when old has one; `deletionTimestamp` := old's when old has
///    one ("an update can never remove/change a deletion timestamp");
///    `deletionGracePeriodSeconds` := old's when new has none. Together with step 1, the stored
///    `deletionTimestamp` is **old's** (K8S-FACTS §6.1 says "set to nil": that is only step 1;
///    step 2 restores it, so a Pod being deleted stays so and one that is not cannot be made so).
/// 3. `ValidatePodStatusUpdate` (`pkg/apis/core/validation/validation.go` @000f2605):
///    - `ValidateObjectMetaUpdate` (`apimachinery/pkg/api/validation/objectmeta.go`): name,
///      namespace, uid, creationTimestamp, deletionTimestamp and deletionGracePeriodSeconds are
///      immutable; no new finalizers while old is being deleted; label keys/values and
///      annotation keys (lower-cased) and total annotation size. Not modelled: the
///      `resourceVersion must be specified` rule (the store fills it for Pods, which allow
///      unconditional updates), ownerReferences and managedFields formats.
///    - `ValidatePodSpecificAnnotationUpdates`: only the mirror-pod annotation rule (§8.1); the
///      AppArmor annotation rules are not modelled.
///    - `validatePodConditions`: condition types other than PodScheduled, Ready and
///      Initialized must be qualified names. The source reports them at
///      `metadata.conditions[i].Type` (sic), and so do we.
///    - `status.nodeName: Forbidden: may not be changed directly` when `spec.nodeName` differs.
///      Kept for fidelity, but it can never fire here: step 1 already copied old's spec, so a
///      webhook's nodeName change is discarded, not refused.
///    - `status.nominatedNodeName`, when changed and non-empty, must be a DNS-1123 subdomain.
///    - `status.qosClass` is immutable (`ValidateImmutableField`, after the backfill: clearing
///      it is harmless, changing it, or setting it where old had none, is refused).
///    - `ValidateContainerStateTransition` / `ValidateInitContainerStateTransition` (see
///      `container_state_transition_errors` below); ephemeral containers count as `Never`;
///      an absent `spec.restartPolicy` is read as its default, Always.
///    - `validatePodIPs` / `validateHostIPs`: every `status.podIPs[*].ip` and
///      `status.hostIPs[*].ip` parses (`netutils.ParseIPSloppy`: IPv4 octets may have leading
///      zeros); with more than one, at most two and one per family, no duplicates; when
///      `hostIPs` is set, `hostIP` must equal `hostIPs[0].ip`. `validatePodIPs` never looks
///      at `podIP`, so there is no `podIP` == `podIPs[0]` check here (whatever the v1 to
///      internal conversion does with the two was not checked and is not modelled).
///    - **No check of `status.phase`**: any string, and any transition (also out of
///      Succeeded/Failed), is accepted.
///    - Not modelled: `resourceClaimStatuses`, container status `user` and
///      `allocatedResourcesStatus` checks.
pub fn pod_status_update_as_api_server(old: &Value, new: &Value) -> Result<Value, Vec<String>> {
    let mut errs = Vec::new();
    for (what, obj) in [("oldObject", old), ("object", new)] {
        if !obj.is_object() {
            errs.push(format!("{what}: Invalid type: expected object"));
            continue;
        }
        for field in ["metadata", "spec", "status"] {
            expect_type(
                obj.get(field),
                "object",
                &format!("{what}.{field}"),
                &mut errs,
            );
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }

    let mut stored = new.clone();
    prepare_pod_status_update(&mut stored, old);
    before_update_metadata(&mut stored, old);
    let errs = validate_pod_status_update(&stored, old);
    if errs.is_empty() {
        Ok(stored)
    } else {
        Err(errs)
    }
}

/// Sets `map[key]` to a copy of `value`, or removes the key when `value` is absent or null.
fn set_or_remove(map: &mut Map<String, Value>, key: &str, value: Option<&Value>) {
    match value.filter(|v| !v.is_null()) {
        Some(v) => {
            map.insert(key.to_string(), v.clone());
        }
        None => {
            map.remove(key);
        }
    }
}

/// The object at `obj[key]`, created empty when absent (the caller checked the type).
fn child_object<'a>(obj: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    let map = obj.as_object_mut().expect("checked to be an object");
    let child = map
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !child.is_object() {
        *child = Value::Object(Map::new());
    }
    child.as_object_mut().expect("just made an object")
}

/// An int64 field as Go reads it: absent, null or not an integer is 0.
fn int_field(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_i64).unwrap_or(0)
}

/// `podStatusStrategy.PrepareForUpdate` (§6.1).
fn prepare_pod_status_update(new: &mut Value, old: &Value) {
    let old_meta = old.get("metadata");
    let old_status = old.get("status");

    set_or_remove(
        new.as_object_mut().expect("checked to be an object"),
        "spec",
        old.get("spec"),
    );

    let meta = child_object(new, "metadata");
    meta.remove("deletionTimestamp");
    set_or_remove(
        meta,
        "ownerReferences",
        old_meta.and_then(|m| m.get("ownerReferences")),
    );

    let had_status = new.get("status").is_some();
    let status = child_object(new, "status");
    if as_str(status.get("qosClass")).is_empty() {
        let old_qos = old_status.and_then(|s| s.get("qosClass"));
        if !as_str(old_qos).is_empty() {
            set_or_remove(status, "qosClass", old_qos);
        }
    }
    preserve_old_observed_generation(status, old_status);
    if !had_status && status.is_empty() {
        new.as_object_mut()
            .expect("checked to be an object")
            .remove("status");
    }
}

/// `preserveOldObservedGeneration` (pkg/registry/core/pod/strategy.go).
fn preserve_old_observed_generation(status: &mut Map<String, Value>, old_status: Option<&Value>) {
    if int_field(status.get("observedGeneration")) == 0 {
        let old_gen = old_status.and_then(|s| s.get("observedGeneration"));
        if int_field(old_gen) != 0 {
            set_or_remove(status, "observedGeneration", old_gen);
        }
    }

    // A list per type, because validation permits several conditions of one type.
    let mut old_generations: BTreeMap<String, std::collections::VecDeque<i64>> = BTreeMap::new();
    for cond in as_array(old_status.and_then(|s| s.get("conditions"))) {
        old_generations
            .entry(as_str(cond.get("type")).to_string())
            .or_default()
            .push_back(int_field(cond.get("observedGeneration")));
    }
    if let Some(Value::Array(conditions)) = status.get_mut("conditions") {
        for cond in conditions.iter_mut() {
            let old_gen = old_generations
                .get_mut(as_str(cond.get("type")))
                .and_then(|gens| gens.pop_front())
                .unwrap_or(0);
            if int_field(cond.get("observedGeneration")) == 0
                && old_gen != 0
                && let Some(map) = cond.as_object_mut()
            {
                map.insert("observedGeneration".to_string(), Value::from(old_gen));
            }
        }
    }
}

/// The metadata rules of `rest.BeforeUpdate` that follow `PrepareForUpdate` (§5.8).
fn before_update_metadata(new: &mut Value, old: &Value) {
    let empty = Value::Object(Map::new());
    let old_meta = old.get("metadata").unwrap_or(&empty);
    let meta = child_object(new, "metadata");

    // "Ensure requests cannot update generation".
    set_or_remove(meta, "generation", old_meta.get("generation"));
    // "Use the existing UID if none is provided".
    if as_str(meta.get("uid")).is_empty() && !as_str(old_meta.get("uid")).is_empty() {
        set_or_remove(meta, "uid", old_meta.get("uid"));
    }
    // "ignore changes to timestamp".
    if !as_str(old_meta.get("creationTimestamp")).is_empty() {
        set_or_remove(meta, "creationTimestamp", old_meta.get("creationTimestamp"));
    }
    // "an update can never remove/change a deletion timestamp".
    if is_set(old_meta.get("deletionTimestamp")) {
        set_or_remove(meta, "deletionTimestamp", old_meta.get("deletionTimestamp"));
    }
    // "an update can never remove/change grace period seconds".
    if is_set(old_meta.get("deletionGracePeriodSeconds"))
        && !is_set(meta.get("deletionGracePeriodSeconds"))
    {
        set_or_remove(
            meta,
            "deletionGracePeriodSeconds",
            old_meta.get("deletionGracePeriodSeconds"),
        );
    }
}

/// A metadata field as Go holds it: absent and null are the zero value, and so is "" for the
/// string and non-pointer timestamp fields.
fn meta_field(meta: Option<&Value>, key: &str) -> Option<Value> {
    match meta.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(v) => Some(v.clone()),
    }
}

/// `field.Invalid(path, new, "field is immutable")` unless `new == old`.
fn immutable_field(new: Option<Value>, old: Option<Value>, path: &str, errs: &mut Vec<String>) {
    if new != old {
        let shown = new.map_or_else(|| "null".to_string(), |v| v.to_string());
        errs.push(format!(
            "{path}: Invalid value: {shown}: field is immutable"
        ));
    }
}

/// `ValidateObjectMetaUpdate` (`ValidateObjectMetaAccessorUpdate`), without the
/// resourceVersion, ownerReferences and managedFields rules.
fn validate_object_meta_update(new: Option<&Value>, old: Option<&Value>, errs: &mut Vec<String>) {
    // Finalizers cannot be added if the object is already being deleted.
    if is_set(old.and_then(|m| m.get("deletionTimestamp"))) {
        let old_finalizers: Vec<&str> = as_array(old.and_then(|m| m.get("finalizers")))
            .iter()
            .map(|f| as_str(Some(f)))
            .collect();
        let added: Vec<&str> = as_array(new.and_then(|m| m.get("finalizers")))
            .iter()
            .map(|f| as_str(Some(f)))
            .filter(|f| !old_finalizers.contains(f))
            .collect();
        if !added.is_empty() {
            errs.push(format!(
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is \
                 being deleted, found new finalizers {added:?}"
            ));
        }
    }
    // Generation is reset to old's by BeforeUpdate, so "must not be decremented" cannot fire.
    for key in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        immutable_field(
            meta_field(new, key),
            meta_field(old, key),
            &format!("metadata.{key}"),
            errs,
        );
    }

    expect_type(
        new.and_then(|m| m.get("labels")),
        "object",
        "metadata.labels",
        errs,
    );
    if let Some(Value::Object(labels)) = new.and_then(|m| m.get("labels")) {
        for (key, value) in labels {
            for msg in qualified_name_errors(key) {
                errs.push(format!("metadata.labels: Invalid value: {key:?}: {msg}"));
            }
            let value = as_str(Some(value));
            for msg in label_value_errors(value) {
                errs.push(format!("metadata.labels: Invalid value: {value:?}: {msg}"));
            }
        }
    }

    expect_type(
        new.and_then(|m| m.get("annotations")),
        "object",
        "metadata.annotations",
        errs,
    );
    if let Some(Value::Object(annotations)) = new.and_then(|m| m.get("annotations")) {
        let mut total = 0;
        for (key, value) in annotations {
            for msg in qualified_name_errors(&key.to_lowercase()) {
                errs.push(format!(
                    "metadata.annotations: Invalid value: {key:?}: {msg}"
                ));
            }
            total += key.len() + as_str(Some(value)).len();
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            errs.push(format!(
                "metadata.annotations: Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} \
                 bytes"
            ));
        }
    }
}

/// The mirror-pod part of `ValidatePodSpecificAnnotationUpdates` (§8.1).
fn validate_mirror_annotation_update(
    new: Option<&Value>,
    old: Option<&Value>,
    errs: &mut Vec<String>,
) {
    let get = |meta: Option<&Value>| {
        meta.and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(MIRROR_POD_ANNOTATION))
            .map(|v| as_str(Some(v)).to_string())
    };
    let path = format!("metadata.annotations[{MIRROR_POD_ANNOTATION}]");
    match (get(new), get(old)) {
        (Some(n), Some(o)) if n == o => {}
        (None, None) => {}
        (_, Some(_)) => errs.push(format!(
            "{path}: Forbidden: may not remove or update mirror pod annotation"
        )),
        (Some(_), None) => errs.push(format!(
            "{path}: Forbidden: may not add mirror pod annotation"
        )),
    }
}

/// `ValidatePodStatusUpdate` on the prepared object (§6.1).
fn validate_pod_status_update(new: &Value, old: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let (new_meta, old_meta) = (new.get("metadata"), old.get("metadata"));
    validate_object_meta_update(new_meta, old_meta, &mut errs);
    validate_mirror_annotation_update(new_meta, old_meta, &mut errs);

    let empty = Value::Object(Map::new());
    let new_status = new.get("status").unwrap_or(&empty);
    let old_status = old.get("status").unwrap_or(&empty);
    let new_spec = new.get("spec").unwrap_or(&empty);
    let old_spec = old.get("spec").unwrap_or(&empty);

    // validatePodConditions, with the source's field path.
    expect_type(
        new_status.get("conditions"),
        "array",
        "status.conditions",
        &mut errs,
    );
    for (i, cond) in as_array(new_status.get("conditions")).iter().enumerate() {
        let ty = as_str(cond.get("type"));
        if SYSTEM_POD_CONDITIONS.contains(&ty) {
            continue;
        }
        for msg in qualified_name_errors(ty) {
            errs.push(format!(
                "metadata.conditions[{i}].Type: Invalid value: {ty:?}: {msg}"
            ));
        }
    }

    if as_str(new_spec.get("nodeName")) != as_str(old_spec.get("nodeName")) {
        errs.push("status.nodeName: Forbidden: may not be changed directly".to_string());
    }

    let nominated = as_str(new_status.get("nominatedNodeName"));
    if !nominated.is_empty() && nominated != as_str(old_status.get("nominatedNodeName")) {
        for msg in dns1123_subdomain_errors(nominated) {
            errs.push(format!(
                "status.nominatedNodeName: Invalid value: {nominated:?}: {msg}"
            ));
        }
    }

    // Pod QoS is immutable.
    let (new_qos, old_qos) = (
        as_str(new_status.get("qosClass")),
        as_str(old_status.get("qosClass")),
    );
    if new_qos != old_qos {
        errs.push(format!(
            "status.qosClass: Invalid value: {new_qos:?}: field is immutable"
        ));
    }

    // The stored Pod was defaulted, so an absent restartPolicy is the default, Always.
    let restart_policy = match as_str(old_spec.get("restartPolicy")) {
        "" => "Always",
        other => other,
    };
    for (list, policy, sidecars) in [
        ("containerStatuses", restart_policy, None),
        ("initContainerStatuses", restart_policy, Some(old_spec)),
        ("ephemeralContainerStatuses", "Never", None),
    ] {
        errs.extend(container_state_transition_errors(
            new_status.get(list),
            old_status.get(list),
            &format!("status.{list}"),
            policy,
            sidecars,
        ));
    }

    errs.extend(validate_status_ips(new_status, "podIPs", None));
    errs.extend(validate_status_ips(new_status, "hostIPs", Some("hostIP")));
    errs
}

/// `ValidateContainerStateTransition` (with `spec` None) and
/// `ValidateInitContainerStateTransition` (with the Pod spec): unless the restart policy is
/// Always, a container whose OLD status is terminated may not have a NEW status (matched by
/// name; every match counts) that is not terminated. Exempt: an old exit code ≠ 0 under
/// OnFailure, and, for init containers, restartable init containers (sidecars: the first
/// `spec.initContainers` entry of that name has `restartPolicy: Always`). The error path uses
/// the index of the OLD status. Regular containers never have per-container restart policies
/// here (the ContainerRestartRules gate is alpha, off).
fn container_state_transition_errors(
    new_statuses: Option<&Value>,
    old_statuses: Option<&Value>,
    path: &str,
    restart_policy: &str,
    spec: Option<&Value>,
) -> Vec<String> {
    let mut errs = Vec::new();
    if restart_policy == "Always" {
        return errs;
    }
    let terminated = |status: &Value| {
        is_set(
            status
                .get("state")
                .and_then(|state| state.get("terminated")),
        )
    };
    for (i, old_status) in as_array(old_statuses).iter().enumerate() {
        if !terminated(old_status) {
            continue;
        }
        let exit_code = int_field(old_status["state"]["terminated"].get("exitCode"));
        if exit_code != 0 && restart_policy == "OnFailure" {
            continue;
        }
        let name = as_str(old_status.get("name"));
        if let Some(spec) = spec {
            let restartable = as_array(spec.get("initContainers"))
                .iter()
                .find(|c| as_str(c.get("name")) == name)
                .is_some_and(is_sidecar);
            if restartable {
                continue;
            }
        }
        for new_status in as_array(new_statuses) {
            if as_str(new_status.get("name")) == name && !terminated(new_status) {
                errs.push(format!(
                    "{path}[{i}].state: Forbidden: may not be transitioned to non-terminated state"
                ));
            }
        }
    }
    errs
}

/// `net.ParseIP` as forked by `netutils.ParseIPSloppy` (Go 1.16 rules): IPv4 dotted quads whose
/// octets may carry leading zeros, or IPv6 (optionally ending in such a dotted quad). No zones.
fn parse_ip_sloppy(s: &str) -> Option<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv6Addr};
    if !s.contains(':') {
        return parse_ipv4_sloppy(s).map(IpAddr::V4);
    }
    if let Ok(v6) = s.parse::<Ipv6Addr>() {
        return Some(IpAddr::V6(v6));
    }
    let (head, tail) = s.rsplit_once(':')?;
    if !tail.contains('.') {
        return None;
    }
    let v4 = parse_ipv4_sloppy(tail)?;
    format!("{head}:{v4}")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

fn parse_ipv4_sloppy(s: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (octet, part) in octets.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value = part.bytes().try_fold(0u32, |n, b| {
            let n = n * 10 + u32::from(b - b'0');
            (n <= 255).then_some(n)
        })?;
        *octet = u8::try_from(value).ok()?;
    }
    Some(std::net::Ipv4Addr::from(octets))
}

/// `netutils.IsIPv6`: not representable as IPv4 (IPv4-mapped IPv6 counts as IPv4).
fn is_ipv6(ip: &std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(_) => false,
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_none(),
    }
}

/// `validatePodIPs` (`list` = "podIPs", no `single`) and `validateHostIPs` (`list` =
/// "hostIPs", `single` = "hostIP"), as described at [`pod_status_update_as_api_server`].
fn validate_status_ips(status: &Value, list: &str, single: Option<&str>) -> Vec<String> {
    let mut errs = Vec::new();
    let path = format!("status.{list}");
    expect_type(status.get(list), "array", &path, &mut errs);
    let entries = as_array(status.get(list));
    let ips: Vec<&str> = entries.iter().map(|e| as_str(e.get("ip"))).collect();
    if ips.is_empty() {
        return errs;
    }
    if let Some(single) = single {
        let single_value = as_str(status.get(single));
        if single_value != ips[0] {
            errs.push(format!(
                "{path}[0].ip: Invalid value: {:?}: must be equal to `{single}`",
                ips[0]
            ));
        }
    }
    let parsed: Vec<Option<std::net::IpAddr>> = ips.iter().map(|ip| parse_ip_sloppy(ip)).collect();
    for (i, (ip, p)) in ips.iter().zip(&parsed).enumerate() {
        if p.is_none() {
            errs.push(format!(
                "{path}[{i}]: Invalid value: {ip:?}: must be a valid IP address, (e.g. 10.9.8.7 \
                 or 2001:db8::ffff)"
            ));
        }
    }
    if ips.len() > 1 {
        // IsDualStackIPStrings: an unparseable entry is an error and "not dual stack".
        let dual_stack = if parsed.iter().any(Option::is_none) {
            errs.push(format!(
                "{path}: Internal error: failed to check for dual stack"
            ));
            false
        } else {
            let v6 = parsed.iter().flatten().filter(|ip| is_ipv6(ip)).count();
            v6 > 0 && v6 < parsed.len()
        };
        if !dual_stack || ips.len() > 2 {
            errs.push(format!(
                "{path}: Invalid value: {}: may specify no more than one IP for each IP family",
                status[list]
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, ip) in ips.iter().enumerate() {
            if !seen.insert(*ip) {
                errs.push(format!("{path}[{i}]: Duplicate value: {ip:?}"));
            }
        }
    }
    errs
}
