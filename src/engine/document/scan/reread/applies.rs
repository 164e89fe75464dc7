//! Whether a patch applies to a created object, decided on the object's sketch: what the
//! check that a repair applies needs, without the object read again. It decides only where it
//! is sure, and leaves the rest to that check on the object (`None`).
//!
//! It is sure of patches whose operations are independent: `add`, `remove` and `replace`,
//! none at a path another one's passes through or ends at, and no `add` or `remove` at an
//! item of a list (which moves the items after it). Each such operation applies to the object
//! as the operations before left it exactly when it applies to the object as sent. That is
//! the shape of the patches the engine's diffs make for the rules that name what they read.

use std::borrow::Cow;

use json_patch::PatchOperation;

use super::super::super::{Keep, OBJECT, Shape, Sketch, array_index};
use super::super::Scanner;
use super::in_part;

/// `Some` when every operation of `patch` applies to the object `sketch` sketches; `None`
/// when one does not, or this cannot tell (see the module's doc).
pub fn applies(sketch: &Sketch<'_>, patch: &[PatchOperation]) -> Option<()> {
    let mut paths = Vec::with_capacity(patch.len());
    for operation in patch {
        let (path, moves_items) = match operation {
            PatchOperation::Add(add) => (add.path.as_str(), true),
            PatchOperation::Remove(remove) => (remove.path.as_str(), true),
            PatchOperation::Replace(replace) => (replace.path.as_str(), false),
            _ => return None,
        };
        let crossed = paths
            .iter()
            .any(|other: &&str| passes_through(path, other) || passes_through(other, path));
        if crossed {
            return None;
        }
        paths.push(path);
        let (parent, target) = place(sketch, path)?;
        let applies = match (parent, target) {
            (Parent::List, _) if moves_items => false,
            (Parent::Object, _) if matches!(operation, PatchOperation::Add(_)) => true,
            (Parent::Object | Parent::List, Target::There) => true,
            _ => false,
        };
        applies.then_some(())?;
    }
    Some(())
}

/// Whether the path `long` passes through or ends at `short`'s end.
fn passes_through(long: &str, short: &str) -> bool {
    long.strip_prefix(short)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// What holds a path's last segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    Object,
    List,
    /// Not there, or a string, a number, `null`.
    Neither,
}

/// Whether a path's last segment names something there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    There,
    Missing,
}

/// Where `path` leads in the object: what holds its last segment, and whether that names
/// something. `None` when the sketch may lack a part the path passes through or ends at.
fn place(sketch: &Sketch<'_>, path: &str) -> Option<(Parent, Target)> {
    place_below(sketch, Some(&OBJECT), &mut Segments::of(path)?)
}

/// [`place`] from `node`, held in part by the sketch with `sketched` (or whole, `None`), for
/// the `segments` left.
fn place_below(
    node: &Sketch<'_>,
    sketched: Option<&'static Shape>,
    segments: &mut Segments<'_>,
) -> Option<(Parent, Target)> {
    if let Sketch::Raw(text) = node {
        return place_in_text(text, segments);
    }
    let segment = segments.next()?;
    let shape = sketched.filter(|shape| in_part(node, shape));
    let (parent, child, child_shape) = match node {
        Sketch::Object(members) => {
            let child_shape = match shape {
                Some(shape) => Some(shape.field(&segment).filter(|s| !s.is_dropped())?),
                None => None,
            };
            let found = members.iter().rev().find(|(key, _)| *key == segment);
            (Parent::Object, found.map(|(_, value)| value), child_shape)
        }
        Sketch::Array(items) => {
            let item = array_index(&segment).and_then(|index| items.get(index));
            (Parent::List, item, shape.and_then(|shape| shape.items()))
        }
        _ => (Parent::Neither, None, None),
    };
    match (child, segments.is_done()) {
        (Some(_), true) => Some((parent, Target::There)),
        (None, true) => Some((parent, Target::Missing)),
        (Some(child), false) => place_below(child, child_shape, segments),
        // A path on through what is not there does not apply, here as in the object.
        (None, false) => Some((Parent::Neither, Target::Missing)),
    }
}

/// [`place_below`] in JSON text the sketch kept, checked when the body was read: the scanner
/// passes over what the path does not go through, building nothing. `None` for a key with
/// escapes, which the scanner declines.
fn place_in_text(text: &str, segments: &mut Segments<'_>) -> Option<(Parent, Target)> {
    let mut at = 0;
    loop {
        let segment = segments.next()?;
        let mut scan = Scanner::starting_at(text, at);
        // Where the value the segment names starts; a key written twice, at its last.
        let mut found = None;
        let parent = match scan.peek()? {
            b'{' => {
                scan.object(|scan, key| {
                    if key == segment {
                        found = Some(scan.position());
                    }
                    scan.pass_over()
                })?;
                Parent::Object
            }
            b'[' => {
                let (wanted, mut index) = (array_index(&segment), 0);
                scan.array(|scan| {
                    if wanted == Some(index) {
                        found = Some(scan.position());
                    }
                    index += 1;
                    scan.pass_over()
                })?;
                Parent::List
            }
            _ => Parent::Neither,
        };
        match (found, segments.is_done()) {
            (Some(_), true) => return Some((parent, Target::There)),
            (None, true) => return Some((parent, Target::Missing)),
            (Some(start), false) => at = start,
            (None, false) => return Some((Parent::Neither, Target::Missing)),
        }
    }
}

/// A JSON Pointer's segments as the keys or indexes they name (RFC 6901: `~1` is `/`, `~0`
/// is `~`), split by hand and unescaped only in a path with a `~`: `str::split`'s searcher and
/// a look for `~` in every segment were a third of the check.
struct Segments<'p> {
    rest: Option<&'p str>,
    escaped: bool,
}

impl<'p> Segments<'p> {
    /// `None` for a pointer that does not start with `/` (the root, which no patch here names).
    fn of(path: &'p str) -> Option<Self> {
        Some(Segments {
            rest: Some(path.strip_prefix('/')?),
            escaped: path.contains('~'),
        })
    }

    fn next(&mut self) -> Option<Cow<'p, str>> {
        let rest = self.rest?;
        let (segment, after) = match rest.bytes().position(|byte| byte == b'/') {
            Some(slash) => (rest.get(..slash)?, rest.get(slash + 1..)),
            None => (rest, None),
        };
        self.rest = after;
        Some(if self.escaped {
            Cow::Owned(segment.replace("~1", "/").replace("~0", "~"))
        } else {
            Cow::Borrowed(segment)
        })
    }

    /// Whether the last segment was taken.
    fn is_done(&self) -> bool {
        self.rest.is_none()
    }
}
