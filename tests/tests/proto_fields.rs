//! The Python client builds its messages from a descriptor of its own
//! (python/nestor/_proto.py: no protoc, no generated code); the driver's
//! are generated from trainer/proto/nestor.proto. This reads both and
//! holds them equal, field by field: every message the Python side defines
//! has the proto's fields, numbers and types, so a field added or
//! renumbered in one and not the other fails here, not on the wire.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

type Fields = BTreeMap<String, BTreeMap<String, (u64, String)>>;

/// message -> field -> (number, type) as `nestor.proto` declares them; a
/// field of a `oneof` has the type `<type> in <oneof>`.
fn from_proto(text: &str) -> Fields {
    let mut out = Fields::new();
    // The blocks open where a line is: (kind, name).
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or_default().trim();
        if let Some(head) = line.strip_suffix('{') {
            let (kind, name) = head.trim().split_once(' ').unwrap();
            if kind == "message" {
                out.entry(name.trim().to_string()).or_default();
            }
            blocks.push((kind.to_string(), name.trim().to_string()));
            continue;
        }
        if line == "}" {
            blocks.pop();
            continue;
        }
        let Some((decl, number)) = line.strip_suffix(';').and_then(|l| l.split_once('=')) else { continue };
        let (msg, oneof) = match blocks.as_slice() {
            [.., (m, msg)] if m == "message" => (msg, None),
            [.., (m, msg), (o, oneof)] if m == "message" && o == "oneof" => (msg, Some(oneof)),
            _ => continue,
        };
        let (ty, name) = decl.trim().rsplit_once(' ').unwrap();
        let mut ty = ty.split_whitespace().collect::<Vec<_>>().join(" ").replace(", ", ",").replace(',', ", ");
        if let Some(o) = oneof {
            ty = format!("{ty} in {o}");
        }
        out.get_mut(msg).unwrap().insert(name.to_string(), (number.trim().parse().unwrap(), ty));
    }
    out
}

const PYTHON: &str = r#"
import json
from google.protobuf import descriptor_pb2
from nestor import _proto
F = descriptor_pb2.FieldDescriptorProto
out = {}
for msg in _proto._file().message_type:
    maps = {n.name: n for n in msg.nested_type if n.options.map_entry}
    fields = {}
    for f in msg.field:
        entry = maps.get(f.type_name.rsplit(".", 1)[-1]) if f.type == F.TYPE_MESSAGE else None
        if entry is not None:
            k, v = entry.field
            ty = "map<%s, %s>" % (F.Type.Name(k.type)[5:].lower(), F.Type.Name(v.type)[5:].lower())
        else:
            ty = f.type_name.rsplit(".", 1)[-1] if f.type in (F.TYPE_MESSAGE, F.TYPE_ENUM) else F.Type.Name(f.type)[5:].lower()
            if f.label == F.LABEL_REPEATED:
                ty = "repeated " + ty
        if f.HasField("oneof_index"):
            ty += " in " + msg.oneof_decl[f.oneof_index].name
        fields[f.name] = [f.number, ty]
    out[msg.name] = fields
print(json.dumps(out))
"#;

#[test]
fn the_python_clients_messages_have_the_protos_fields_numbers_and_types() {
    let proto = from_proto(&std::fs::read_to_string(common::python::repo().join("trainer/proto/nestor.proto")).unwrap());
    assert_eq!(proto["ReportRequest"]["metrics"], (5, "map<string, double>".to_string()));
    assert_eq!(proto["BookReply"]["workers"], (1, "repeated GrantedBundle".to_string()));
    assert_eq!(proto["ReportRequest"]["checkpoint_uploaded"], (9, "string in checkpoint".to_string()));
    assert_eq!(proto["ReportRequest"]["extra"], (10, "string".to_string()));
    let python = common::python::torch_venv().join("bin/python");
    let out =
        std::process::Command::new(python).args(["-c", PYTHON]).env("PYTHONPATH", common::python::repo().join("python")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: BTreeMap<String, BTreeMap<String, (u64, String)>> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(theirs.len() >= 10, "{theirs:?}");
    for (msg, fields) in &theirs {
        let ours = proto.get(msg).unwrap_or_else(|| panic!("Python defines {msg}, which nestor.proto does not"));
        assert_eq!(fields, ours, "{msg}: Python's fields (left) against nestor.proto's (right)");
    }
}
