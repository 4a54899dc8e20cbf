//! The module graph of this crate, derived from its sources: module A uses module B when a path
//! in A (in a `use` declaration or in code, tests included) names B through `crate::`, `super::`,
//! `self::` or one of A's child modules. The tests fail on any cycle, on a module reached through
//! a re-export of the crate's root (which would hide what it uses), and on a module the crate
//! docs' module map leaves out or lists below one it uses. Print the graph with
//! `cargo test -p semaphore-core --test module_graph -- --nocapture`; check another checkout's
//! sources with `MODULE_GRAPH_SRC=<its crates/core/src>` set.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// The crate root's node.
const ROOT: &str = "crate";

/// Which module uses which, by module path (`dynamo::codec`; the root is [`ROOT`]).
#[derive(Debug, Default)]
struct Graph {
    uses: BTreeMap<String, BTreeSet<String>>,
    /// Paths that reach a module through the root's re-exports: `(module, path)`.
    through_root: Vec<(String, String)>,
}

/// A token as the scan needs it: `::` is one token, comments are gone (doc comments are string
/// literals of `#[doc]` attributes, which name nothing).
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
    Group(Delimiter, Vec<Tok>),
    Literal,
}

fn toks(stream: TokenStream) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut trees = stream.into_iter().peekable();
    while let Some(tree) = trees.next() {
        out.push(match tree {
            TokenTree::Ident(ident) => Tok::Ident(ident.to_string()),
            TokenTree::Punct(p) if p.as_char() == ':' && p.spacing() == Spacing::Joint => {
                match trees.peek() {
                    Some(TokenTree::Punct(next)) if next.as_char() == ':' => {
                        trees.next();
                        Tok::PathSep
                    }
                    _ => Tok::Punct(':'),
                }
            }
            TokenTree::Punct(p) => Tok::Punct(p.as_char()),
            TokenTree::Group(g) => Tok::Group(g.delimiter(), toks(g.stream())),
            TokenTree::Literal(_) => Tok::Literal,
        });
    }
    out
}

/// The module path of a source file, relative to `src/`: `lib.rs` is the root, `a/mod.rs` and
/// `a.rs` are `a`, `a/b.rs` is `a::b`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("lib" | "mod")) {
        parts.pop();
    }
    parts
}

fn name(path: &[String]) -> String {
    if path.is_empty() {
        ROOT.to_owned()
    } else {
        path.join("::")
    }
}

impl Graph {
    /// The graph of the crate whose sources are `files`: (path relative to `src/`, text).
    fn of(files: &[(String, String)]) -> Self {
        let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_of(f)).collect();
        let mut graph = Self::default();
        for (file, text) in files {
            let module = module_of(file);
            graph.uses.entry(name(&module)).or_default();
            let tokens = toks(TokenStream::from_str(text).unwrap_or_else(|e| {
                panic!("{file} does not tokenize: {e}");
            }));
            let mut scan = Scan {
                file_module: &module,
                modules: &modules,
                graph: &mut graph,
            };
            scan.walk(&tokens, &module);
        }
        graph
    }

    /// Every cycle, as the modules of each strongly connected component of more than one (a
    /// module's paths to itself are not uses).
    fn cycles(&self) -> Vec<Vec<String>> {
        // Tarjan's algorithm.
        struct State<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            found: Vec<Vec<String>>,
        }
        fn visit<'g>(s: &mut State<'g>, v: &'g str) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            s.on_stack.insert(v);
            let graph = s.graph;
            for w in graph.uses.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
            if s.low[v] == s.index[v] {
                let mut component = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    s.found.push(component);
                }
            }
        }
        let mut state = State {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for v in self.uses.keys() {
            if !state.index.contains_key(v.as_str()) {
                visit(&mut state, v);
            }
        }
        state.found
    }

    /// The shortest cycle through `start` (modules in order, back to `start`), if any.
    fn shortest_cycle(&self, start: &str) -> Option<Vec<String>> {
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut frontier = vec![start];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for v in frontier {
                for w in self.uses.get(v).into_iter().flatten() {
                    if w == start {
                        let mut back = Vec::new();
                        let mut at = v;
                        while at != start {
                            back.push(at.to_owned());
                            at = came_from[at];
                        }
                        let mut cycle = vec![start.to_owned()];
                        cycle.extend(back.into_iter().rev());
                        cycle.push(start.to_owned());
                        return Some(cycle);
                    }
                    if !came_from.contains_key(w.as_str()) {
                        came_from.insert(w, v);
                        next.push(w.as_str());
                    }
                }
            }
            frontier = next;
        }
        None
    }

    fn render(&self) -> String {
        self.uses
            .iter()
            .filter(|(module, _)| module.as_str() != ROOT)
            .map(|(module, uses)| {
                let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
                let uses = if uses.is_empty() {
                    "(nothing)".to_owned()
                } else {
                    uses.join(", ")
                };
                format!("{module} -> {uses}\n")
            })
            .collect()
    }
}

struct Scan<'a> {
    file_module: &'a [String],
    modules: &'a BTreeSet<Vec<String>>,
    graph: &'a mut Graph,
}

impl Scan<'_> {
    /// Scans `tokens`, written in module `here` (the file's module, or an inline module in it).
    fn walk(&mut self, tokens: &[Tok], here: &[String]) {
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                Tok::Ident(word) if word == "mod" => {
                    if let (Some(Tok::Ident(inner)), Some(Tok::Group(Delimiter::Brace, body))) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                    {
                        let mut inline = here.to_vec();
                        inline.push(inner.clone());
                        self.walk(body, &inline);
                        i += 3;
                        continue;
                    }
                }
                Tok::Ident(word) if word == "use" => {
                    let end = tokens[i..]
                        .iter()
                        .position(|t| *t == Tok::Punct(';'))
                        .map_or(tokens.len(), |n| i + n);
                    for path in use_paths(&tokens[i + 1..end], Vec::new()) {
                        self.used(here, &path);
                    }
                    i = end + 1;
                    continue;
                }
                Tok::Ident(first) if tokens.get(i + 1) == Some(&Tok::PathSep) => {
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while let (Some(Tok::PathSep), Some(Tok::Ident(segment))) =
                        (tokens.get(j), tokens.get(j + 1))
                    {
                        path.push(segment.clone());
                        j += 2;
                    }
                    self.used(here, &path);
                    i = j;
                    continue;
                }
                Tok::Group(_, inner) => self.walk(inner, here),
                _ => {}
            }
            i += 1;
        }
    }

    /// Notes the module `path` (as written in `here`) names, if it names one of this crate's.
    fn used(&mut self, here: &[String], path: &[String]) {
        let Some(absolute) = self.absolute(here, path) else {
            return;
        };
        let target = (0..=absolute.len())
            .rev()
            .map(|n| &absolute[..n])
            .find(|prefix| self.modules.contains(*prefix))
            .unwrap_or(&[]);
        let (from, to) = (name(self.file_module), name(target));
        if from == to {
            return;
        }
        if to == ROOT {
            let written = path.join("::");
            self.graph.through_root.push((from, written));
            return;
        }
        self.graph.uses.entry(from).or_default().insert(to);
    }

    /// `path` from the crate's root, or `None` if it is not this crate's.
    fn absolute(&self, here: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut base = here.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            // A child module of the module it is written in (edition 2018 paths).
            Some(first) => {
                let mut child = here.to_vec();
                child.push(first.to_owned());
                if !self.modules.contains(&child) {
                    return None;
                }
            }
            None => return None,
        }
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    }
}

/// The paths a `use` tree names (after `use`, before `;`), each from `prefix`: `a::{b, c::d}`
/// names `a::b` and `a::c::d`; a glob or a rename ends a path.
fn use_paths(tree: &[Tok], prefix: Vec<String>) -> Vec<Vec<String>> {
    let mut path = prefix;
    for (n, token) in tree.iter().enumerate() {
        match token {
            Tok::Ident(word) if word == "as" => break,
            Tok::Ident(segment) => path.push(segment.clone()),
            Tok::Group(Delimiter::Brace, inner) => {
                return inner
                    .split(|t| *t == Tok::Punct(','))
                    .filter(|part| !part.is_empty())
                    .flat_map(|part| use_paths(part, path.clone()))
                    .collect();
            }
            Tok::PathSep if n == 0 => return Vec::new(), // `::name`: an extern crate
            _ => {}
        }
    }
    vec![path]
}

/// Every `.rs` file under `dir`, as (path relative to `dir`, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(current) = dirs.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir).unwrap().to_string_lossy();
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((relative.replace('\\', "/"), text));
            }
        }
    }
    files.sort();
    files
}

/// The top-level modules the crate docs' module map lists (`//! | [`name`] | ...` rows of
/// `lib.rs`), in order.
fn module_map(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! | "))
        .filter_map(|row| row.split('`').nth(1))
        .map(str::to_owned)
        .collect()
}

/// The graph of this crate's `src/`, or of the sources in `MODULE_GRAPH_SRC` if set (to check
/// another checkout of the crate, say an older one).
fn crate_graph() -> (Graph, Vec<(String, String)>) {
    let src = std::env::var_os("MODULE_GRAPH_SRC").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        std::path::PathBuf::from,
    );
    let files = sources(&src);
    (Graph::of(&files), files)
}

#[test]
fn the_modules_form_no_cycle() {
    let (graph, _) = crate_graph();
    println!("{}", graph.render());
    let cycles = graph.cycles();
    let shortest: BTreeSet<String> = cycles
        .iter()
        .flatten()
        .filter_map(|module| graph.shortest_cycle(module))
        .map(|cycle| cycle.join(" -> "))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles among {cycles:?}, e.g.:\n{}\n\nthe graph:\n{}",
        shortest.into_iter().collect::<Vec<_>>().join("\n"),
        graph.render()
    );
}

#[test]
fn no_module_is_reached_through_the_crate_roots_re_exports() {
    let (graph, _) = crate_graph();
    assert!(
        graph.through_root.is_empty(),
        "name the module a path uses (crate::input::Limit, not crate::Limit): {:?}",
        graph.through_root
    );
}

#[test]
fn the_module_map_lists_every_module_below_those_it_uses() {
    let (graph, files) = crate_graph();
    let lib = &files.iter().find(|(f, _)| f == "lib.rs").unwrap().1;
    let map = module_map(lib);
    let top = |module: &str| module.split("::").next().unwrap().to_owned();
    for module in graph.uses.keys().filter(|m| m.as_str() != ROOT) {
        assert!(
            map.contains(&top(module)),
            "{module} is not in lib.rs's module map {map:?}"
        );
    }
    for (module, uses) in graph.uses.iter().filter(|(m, _)| m.as_str() != ROOT) {
        let at = map.iter().position(|m| *m == top(module)).unwrap();
        for used in uses.iter().filter(|u| top(u) != top(module)) {
            let used_at = map.iter().position(|m| *m == top(used)).unwrap();
            assert!(
                used_at < at,
                "{module} uses {used}, listed after it in lib.rs's module map {map:?}"
            );
        }
    }
}

/// The check itself: a cycle through `use crate::`, through a path in code, through `super::`
/// and a parent's re-export, and through a `use` group, is found; a test module's
/// `use super::*` is not a cycle.
#[test]
fn a_cycle_is_found_however_the_paths_are_written() {
    let files = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    };
    let acyclic = Graph::of(&files(&[
        ("lib.rs", "pub mod a; pub mod b; pub use a::A;"),
        (
            "a.rs",
            "pub struct A; #[cfg(test)] mod tests { use super::*; }",
        ),
        (
            "b.rs",
            "use crate::a::A; /// crate::b::x in a comment\nfn f() {}",
        ),
    ]));
    assert!(acyclic.cycles().is_empty(), "{acyclic:?}");
    assert_eq!(acyclic.render(), "a -> (nothing)\nb -> a\n");

    let in_code = Graph::of(&files(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b::B; pub struct A;"),
        ("b.rs", "pub struct B; fn f() { let _ = crate::a::A; }"),
    ]));
    assert_eq!(in_code.cycles(), [["a", "b"]]);
    assert_eq!(in_code.shortest_cycle("b").unwrap(), ["b", "a", "b"]);

    let through_parent = Graph::of(&files(&[
        ("lib.rs", "mod d;"),
        ("d/mod.rs", "mod x; mod y; pub use x::X;"),
        ("d/x.rs", "pub struct X;"),
        ("d/y.rs", "use super::X;"),
        ("d/z.rs", "use super::{y::Y, self as d};"),
    ]));
    assert!(through_parent.cycles().is_empty());
    assert_eq!(
        through_parent.render(),
        "d -> d::x\nd::x -> (nothing)\nd::y -> d\nd::z -> d, d::y\n"
    );
    let through_parent = Graph::of(&files(&[
        ("lib.rs", "mod d;"),
        ("d/mod.rs", "mod x; mod y; pub use y::Y;"),
        ("d/x.rs", "pub struct X;"),
        ("d/y.rs", "use super::{x::X, Y as Again}; pub struct Y;"),
    ]));
    assert_eq!(through_parent.cycles(), [["d", "d::y"]]);

    let via_root = Graph::of(&files(&[
        ("lib.rs", "mod a; pub use a::A;"),
        ("a.rs", "pub struct A; fn f() -> crate::A { crate::A }"),
    ]));
    assert_eq!(
        via_root.through_root,
        vec![("a".to_owned(), "crate::A".to_owned()); 2]
    );
}
