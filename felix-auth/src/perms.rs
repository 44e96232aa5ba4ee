//! Permissions carried in a Felix token: `"<action>:<object pattern>"`, e.g.
//! `"stream.publish:stream:t1/default/*"`, where `*` in the pattern matches any run of
//! characters (including `/`).

use std::fmt;

/// The actions a broker enforces, plus the control-plane ones a token may also carry (kept so
/// a token listing them parses, though the broker never asks for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    StreamPublish,
    StreamSubscribe,
    StreamManage,
    /// Reading a stream's spec and placement (`GET /v1/streams…` on the ops endpoint).
    StreamView,
    CacheRead,
    CacheWrite,
    CacheManage,
    /// Reading a cache's spec and placement (`GET /v1/caches…`).
    CacheView,
    GroupConsume,
    GroupManage,
    NsManage,
    TenantManage,
    /// Cluster operations on `cluster:*` (giving up a shard's records: `felix admin abandon`).
    NodeManage,
}

impl Action {
    pub const ALL: [Action; 13] = [
        Action::StreamPublish,
        Action::StreamSubscribe,
        Action::StreamManage,
        Action::StreamView,
        Action::CacheRead,
        Action::CacheWrite,
        Action::CacheManage,
        Action::CacheView,
        Action::GroupConsume,
        Action::GroupManage,
        Action::NsManage,
        Action::TenantManage,
        Action::NodeManage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::StreamPublish => "stream.publish",
            Action::StreamSubscribe => "stream.subscribe",
            Action::StreamManage => "stream.manage",
            Action::StreamView => "stream.view",
            Action::CacheRead => "cache.read",
            Action::CacheWrite => "cache.write",
            Action::CacheManage => "cache.manage",
            Action::CacheView => "cache.view",
            Action::GroupConsume => "group.consume",
            Action::GroupManage => "group.manage",
            Action::NsManage => "ns.manage",
            Action::TenantManage => "tenant.manage",
            Action::NodeManage => "node.manage",
        }
    }

    pub fn from_name(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One grant: an action over every object its pattern matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub action: Action,
    pub object: String,
}

impl Permission {
    /// Parses `"<action>:<kind>:<rest>"`. Actions this broker does not know (`rbac.view`,
    /// ...) and malformed strings give `None`: they grant nothing here.
    pub fn parse(s: &str) -> Option<Permission> {
        let (action, object) = s.split_once(':')?;
        let action = Action::from_name(action)?;
        let (kind, rest) = object.split_once(':')?;
        if kind.is_empty() || rest.is_empty() {
            return None;
        }
        Some(Permission {
            action,
            object: object.to_owned(),
        })
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.action, self.object)
    }
}

/// Object kinds that live inside a tenant: `<kind>:<tenant>[/...]`.
const TENANT_KINDS: [&str; 5] = ["tenant", "namespace", "stream", "cache", "group"];

/// The tenant an object belongs to, or `None` for objects outside any tenant (`cluster:*`,
/// `node:...`) and malformed ones.
pub fn object_tenant(object: &str) -> Option<&str> {
    let (kind, rest) = object.split_once(':')?;
    if !TENANT_KINDS.contains(&kind) {
        return None;
    }
    let tenant = rest.split('/').next()?;
    (!tenant.is_empty()).then_some(tenant)
}

/// `*` matches any run of characters (possibly empty); every other byte matches itself.
/// Greedy with one backtrack point: O(len(pattern) × len(text)) at worst, no recursion.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            // Let the last `*` swallow one more character and retry.
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Longest tenant, namespace, stream or cache name, in bytes. Names are persisted (storage
/// paths, object strings), so this is a rule of the broker rather than a knob.
pub const NAME_MAX_BYTES: usize = 255;

/// A tenant, namespace, stream or cache name: 1..=[`NAME_MAX_BYTES`] bytes of
/// `[A-Za-z0-9._-]`. Nothing else can appear in one, so an object string built from names
/// can never be ambiguous (`/` and `:` separate its parts, `*` is a wildcard).
pub fn valid_name(name: &str) -> bool {
    (1..=NAME_MAX_BYTES).contains(&name.len()) && name_charset_ok(name)
}

/// Every byte of `name` is one a name may hold (whatever its length).
pub fn name_charset_ok(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The object a stream's operations are checked against, or `None` when a name breaks the
/// naming rule ([`valid_name`]).
pub fn stream_object(tenant: &str, namespace: &str, stream: &str) -> Option<String> {
    scoped_object("stream", tenant, namespace, stream)
}

/// The object a cache's operations are checked against (same rules as [`stream_object`]).
pub fn cache_object(tenant: &str, namespace: &str, cache: &str) -> Option<String> {
    scoped_object("cache", tenant, namespace, cache)
}

fn scoped_object(kind: &str, tenant: &str, namespace: &str, name: &str) -> Option<String> {
    if !(valid_name(tenant) && valid_name(namespace) && valid_name(name)) {
        return None;
    }
    // Built by hand: this runs for every publish and cache call, and `format!`'s machinery
    // cost more than the rest of the permission check (docs/performance.md, profile).
    let mut object =
        String::with_capacity(kind.len() + tenant.len() + namespace.len() + name.len() + 3);
    for part in [kind, ":", tenant, "/", namespace, "/", name] {
        object.push_str(part);
    }
    Some(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_runs_of_any_characters() {
        assert!(glob_match("stream:t1/*", "stream:t1/default/orders"));
        assert!(glob_match("stream:t1/*/*", "stream:t1/default/orders"));
        assert!(glob_match(
            "stream:t1/default/*",
            "stream:t1/default/orders"
        ));
        assert!(glob_match(
            "stream:t1/default/ord*s",
            "stream:t1/default/orders"
        ));
        assert!(glob_match("stream:t1/*/orders", "stream:t1/a/b/orders"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a**b", "ab"));
        assert!(!glob_match("stream:t1/default/*", "stream:t1/other/orders"));
        assert!(!glob_match(
            "stream:t1/default/orders",
            "stream:t1/default/orders2"
        ));
        assert!(!glob_match(
            "stream:t1/default/orders*x",
            "stream:t1/default/orders"
        ));
        assert!(!glob_match("", "x"));
        // Pathological patterns stay cheap (quadratic at worst, not exponential).
        let text = "a".repeat(2000);
        assert!(!glob_match(&("*a".repeat(50) + "b"), &text));
    }

    #[test]
    fn permissions_parse_known_actions_only() {
        let p = Permission::parse("stream.publish:stream:t1/default/*").unwrap();
        assert_eq!(p.action, Action::StreamPublish);
        assert_eq!(p.object, "stream:t1/default/*");
        assert_eq!(p.to_string(), "stream.publish:stream:t1/default/*");
        assert_eq!(Permission::parse("rbac.view:tenant:t1"), None);
        assert_eq!(Permission::parse("stream.publish"), None);
        assert_eq!(Permission::parse("stream.publish:stream"), None);
        assert_eq!(Permission::parse("stream.publish:stream:"), None);
        for a in Action::ALL {
            assert_eq!(Action::from_name(a.as_str()), Some(a));
        }
    }

    #[test]
    fn object_tenants() {
        assert_eq!(object_tenant("stream:t1/default/orders"), Some("t1"));
        assert_eq!(object_tenant("tenant:t1"), Some("t1"));
        assert_eq!(object_tenant("group:t9/ns/s/g"), Some("t9"));
        assert_eq!(object_tenant("cluster:*"), None);
        assert_eq!(object_tenant("node:n1"), None);
        assert_eq!(object_tenant("stream:/x/y"), None);
        assert_eq!(object_tenant("garbage"), None);
    }

    #[test]
    fn objects_refuse_ambiguous_names() {
        assert_eq!(
            stream_object("t1", "default", "orders").as_deref(),
            Some("stream:t1/default/orders")
        );
        assert_eq!(
            cache_object("t1", "default", "c1").as_deref(),
            Some("cache:t1/default/c1")
        );
        assert_eq!(stream_object("t1", "a/b", "c"), None);
        assert_eq!(stream_object("t1", "", "c"), None);
        assert_eq!(cache_object("t1:x", "ns", "c"), None);
    }

    #[test]
    fn names_are_1_to_255_bytes_of_a_small_charset() {
        let longest = "a".repeat(NAME_MAX_BYTES);
        assert!(valid_name(&longest));
        assert!(!valid_name(&(longest.clone() + "a")), "one past the limit");
        assert!(valid_name("Orders_v1.eu-west-2"));
        assert!(
            valid_name("."),
            "dots are plain characters (storage escapes them)"
        );
        for bad in [
            "", "a b", "a/b", "a:b", "a*", "ä", "a\0", "a\n", "a%2F", "t1,t2",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(stream_object("t1", "default", &longest).is_some());
        assert_eq!(stream_object("t1", "default", &(longest + "x")), None);
        assert_eq!(cache_object("t1", "default", "c*"), None);
    }
}
