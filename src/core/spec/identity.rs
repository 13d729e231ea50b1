//! The identity a provider's nodes get, as task files and the user's
//! `config.yaml` name it (`<provider>.remote_identity`).

use super::yaml::{Kind, Node};
use super::SpecError;

/// The key of a provider's section that names the identity its nodes
/// get (SkyPilot's spelling): an identity the user made, by the name the
/// provider knows it by, or [`LOCAL_CREDENTIALS`].
pub(crate) const REMOTE_IDENTITY: &str = "remote_identity";

/// SkyPilot's value for "nodes get credentials derived from the user's":
/// gangway's default, the same as no `remote_identity`.
pub(crate) const LOCAL_CREDENTIALS: &str = "LOCAL_CREDENTIALS";

/// Checks every `<provider>.remote_identity` of a config mapping (the
/// user's file, or a task's `config:` whose fields start with `prefix`):
/// one name, or `LOCAL_CREDENTIALS`. SkyPilot's other forms are refused,
/// located: `SERVICE_ACCOUNT` and `NO_UPLOAD` (an identity SkyPilot makes
/// or none at all) and the per-cluster list.
pub(crate) fn check_identities(file: &str, config: &Node, prefix: &str) -> Result<(), SpecError> {
    let Kind::Map(sections) = &config.kind else {
        return Ok(());
    };
    for (k, section) in sections {
        let (Kind::Scalar { text: provider, .. }, Kind::Map(fields)) = (&k.kind, &section.kind)
        else {
            continue;
        };
        for (fk, v) in fields {
            if !matches!(&fk.kind, Kind::Scalar { text, .. } if text == REMOTE_IDENTITY) {
                continue;
            }
            let field = format!("{prefix}{provider}.{REMOTE_IDENTITY}");
            let err = |message: String, hint: &str| SpecError {
                file: file.to_string(),
                line: fk.pos.line,
                col: fk.pos.col,
                field: field.clone(),
                message,
                hint: Some(hint.to_string()),
                unsupported: true,
            };
            let name_it = "name an identity you made (docs/storage.md, \"Credentials\"), or LOCAL_CREDENTIALS for credentials made from yours";
            match &v.kind {
                Kind::Scalar { text, .. } if text.trim().is_empty() => {
                    return Err(err("is empty".into(), name_it))
                }
                Kind::Scalar { text, .. }
                    if text.eq_ignore_ascii_case("SERVICE_ACCOUNT")
                        || text.eq_ignore_ascii_case("NO_UPLOAD") =>
                {
                    return Err(err(
                        format!("{text} is not supported: gangway never makes an identity for you and never leaves nodes without credentials"),
                        name_it,
                    ))
                }
                Kind::Scalar { .. } => {}
                Kind::Seq(_) => {
                    return Err(err(
                        "the per-cluster list form is not supported".into(),
                        "give one name for every cluster (a task's config: can name another)",
                    ))
                }
                _ => return Err(err(format!("expected a name, found {}", v.describe()), name_it)),
            }
        }
    }
    Ok(())
}
