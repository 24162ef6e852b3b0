"""The vLLM internals verl reaches into, found statically in verl's source and looked up statically in a vLLM
source tree, so that the vLLM release of the GPU trainer image is chosen on evidence (issue 28 row 12).

What counts as a reference (every verl module that names vLLM, read with `ast`, nothing imported):
- `import vllm.x.y` and `from vllm.x import Y` (kind `import`), wherever they stand (module top, a function, a
  try block: verl guards some with a fallback, and the record says which resolve);
- an attribute read or written through a name bound to such an import (`attr` / `patch`), e.g.
  `AsyncLLM.from_vllm_config`, `setattr(LRUCacheWorkerLoRAManager, "_load_adapter", ...)`;
- a call through such a name with keyword arguments (`call`), e.g. `AsyncEngineArgs(enable_sleep_mode=...)`:
  the keywords must be parameters of the function (or of the class's `__init__`, or its fields for a dataclass
  or a pydantic model), unless it takes `**kwargs`;
- what verl's worker extension (mixed into vLLM's GPU `Worker` by `worker_extension_cls`) reads from the worker
  (`self.x`) and from its model runner (`self.model_runner.x`) that the extension does not define itself
  (`worker`);
- what verl's rollout server reads and calls on its `AsyncLLM` (`self.engine.x`, kind `engine`), with keywords;
- the `vllm serve` options verl's rollout server builds, and those AGL's trainer config adds (`option`), which
  must be fields of vLLM's engine or frontend arguments (an unknown one stops the server at start).

A reference is `ok` when the vLLM tree defines it (`refuses k` names a keyword a call passes that the callable
no longer takes): a module file, a top-level binding (def, class, assignment,
import, also under `if`/`try`), a submodule, or a class member (its body, `self.x =` in its methods, its bases,
followed through imports). What is read through a value (an instance, a function's result) is checked only as far
as the value. Re-running this on a new verl or vLLM and comparing with the committed record
(deploy/docker/trainer-vllm-surface.txt) shows what moved.

    python -m tools.vllm_surface --vllm-src DIR [--verl-src DIR] [--write deploy/docker/trainer-vllm-surface.txt]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# verl's worker extension and the vLLM classes it is mixed into / reads from (vllm.v1.worker).
EXTENSION = ("workers/rollout/vllm_rollout/utils.py", "vLLMColocateWorkerExtension")
WORKER = ("vllm.v1.worker.gpu_worker", "Worker")
MODEL_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
# Attributes of verl's objects that hold a vLLM object of a known class (set from `AsyncLLM.from_vllm_config`):
# (verl file, attribute of self) -> the class; what verl reads and calls on them is checked there.
RECEIVERS = {("workers/rollout/vllm_rollout/vllm_async_server.py", "engine"): ("vllm.v1.engine.async_llm", "AsyncLLM")}
# verl's rollout server builds `vllm serve`'s arguments as dicts of option names (`args`, `dp_args`, ...), AGL adds
# its own (`actor_rollout_ref.rollout.engine_kwargs.vllm`); vLLM declares them as fields of these classes (the
# frontend's moved from entrypoints.openai to entrypoints.launchers).
SERVER = "workers/rollout/vllm_rollout/vllm_async_server.py"
SERVE_ARGS = (
    ("vllm.engine.arg_utils", "AsyncEngineArgs"),
    ("vllm.entrypoints.launchers.cli_args", "FrontendArgs"),
    ("vllm.entrypoints.openai.cli_args", "FrontendArgs"),
)
AGL_CONFIG = "services/trainer/hydra-conf/agl_trainer.yaml"
DEPTH = 8


@dataclass(frozen=True, order=True)
class Reference:
    """One place verl depends on vLLM: `target` is a dotted path (`vllm.a.b:Name.attr` for names in a module)."""

    kind: str  # import | attr | patch | call | worker | engine | option
    verl_file: str  # relative to the verl package; `agl:<path>` for AGL's own
    target: str


def verl_files(verl_root: Path) -> Iterator[Path]:
    """verl's modules that name vLLM at all."""
    for path in sorted(verl_root.rglob("*.py")):
        if "vllm" in path.read_text(errors="replace"):
            yield path


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything else (a call, a subscript)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def file_references(tree: ast.Module, rel: str) -> set[Reference]:
    """The imports of vLLM in one verl module and what is read or patched through the names they bind."""
    bound: dict[str, str] = {}  # local name -> "vllm.mod" or "vllm.mod:Name"
    found: set[Reference] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vllm":
                    found.add(Reference("import", rel, alias.name))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["vllm"] = "vllm"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            for alias in node.names:
                target = f"{node.module}:{alias.name}"
                found.add(Reference("import", rel, target))
                bound[alias.asname or alias.name] = target
    written: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                parts = _chain(target)
                if parts and len(parts) > 1 and parts[0] in bound:
                    found.add(Reference("patch", rel, _join(bound[parts[0]], parts[1:])))
                    written.add(id(target))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            obj, name = [*node.args, None, None][:2]
            if isinstance(obj, ast.Name) and obj.id in bound and isinstance(name, ast.Constant):
                found.add(Reference("patch", rel, _join(bound[obj.id], [str(name.value)])))
    for node in ast.walk(tree):
        parts = _chain(node.func) if isinstance(node, ast.Call) else None
        keywords = sorted(k.arg for k in node.keywords if k.arg) if isinstance(node, ast.Call) else []
        if parts and parts[0] in bound and keywords:
            found.add(Reference("call", rel, f"{_join(bound[parts[0]], parts[1:])}({','.join(keywords)})"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in written and not isinstance(node.ctx, ast.Del):
            parts = _chain(node)
            if parts and parts[0] in bound:
                found.add(Reference("attr", rel, _join(bound[parts[0]], parts[1:])))
    # Only the longest read of a chain: `a.b.c` implies `a.b`.
    reads = {r.target for r in found if r.kind == "attr"}
    return {r for r in found if r.kind != "attr" or not any(t.startswith(r.target + ".") for t in reads)}


def _join(base: str, attrs: list[str]) -> str:
    if ":" in base:
        return ".".join([base, *attrs])
    # A module bound by `import vllm.x`: its attributes may be submodules or names; resolved later.
    return base + (":" + ".".join(attrs) if attrs else "")


def extension_references(tree: ast.Module, rel: str, class_name: str) -> set[Reference]:
    """What verl's worker extension reads from the vLLM worker it is mixed into (and from its model runner)."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    own = _members(cls, owner=None)
    found: set[Reference] = set()
    for node in ast.walk(cls):
        parts = _chain(node) if isinstance(node, ast.Attribute) else None
        if not parts or parts[0] != "self" or parts[1] in own:
            continue
        if parts[1] == "model_runner" and len(parts) > 2:
            found.add(Reference("worker", rel, f"{MODEL_RUNNER[0]}:{MODEL_RUNNER[1]}.{parts[2]}"))
        else:
            found.add(Reference("worker", rel, f"{WORKER[0]}:{WORKER[1]}.{parts[1]}"))
    return found


def receiver_references(tree: ast.Module, rel: str, attribute: str, cls: tuple[str, str]) -> set[Reference]:
    """What verl reads and calls on `self.<attribute>`, an instance of vLLM class `cls` (kind `engine`)."""
    found: set[Reference] = set()
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        parts = _chain(node) if isinstance(node, ast.Attribute) else None
        if parts and len(parts) == 3 and parts[:2] == ["self", attribute]:
            call = calls.get(id(node))
            keywords = sorted(k.arg for k in call.keywords if k.arg) if call else []
            found.add(
                Reference("engine", rel, f"{cls[0]}:{cls[1]}.{parts[2]}" + (f"({','.join(keywords)})" * bool(keywords)))
            )
    return found


def server_options(tree: ast.Module, rel: str) -> set[Reference]:
    """The `vllm serve` options verl's rollout server passes: in the function that assigns a dict to `args`, the
    keys of the dicts it assigns to, updates into or subscripts on `args` and `*_args` (`dp_args`, `lora_args`; not
    the `*kwargs` of its calls), kind `option`."""

    def cli(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and (node.id == "args" or node.id.endswith("_args"))

    def keys_of(node: ast.AST) -> set[str]:
        return {k.value for k in node.keys if isinstance(k, ast.Constant)} if isinstance(node, ast.Dict) else set()

    def builds(fn: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id == "args" for t in n.targets)
            for n in ast.walk(fn)
        )

    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and builds(n)]
    keys: set[str] = set()
    for node in (n for fn in functions for n in ast.walk(fn)):
        if isinstance(node, ast.Assign) and any(cli(t) for t in node.targets):
            keys |= keys_of(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            keys |= keys_of(node.args[0]) if cli(node.func.value) and node.args else set()
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and cli(node.value):
            keys |= {node.slice.value} if isinstance(node.slice, ast.Constant) else set()
    return {Reference("option", rel, "--" + str(k).replace("_", "-")) for k in keys}


def agl_options(config: Path) -> set[Reference]:
    """The `vllm serve` options AGL's trainer config adds through verl (engine_kwargs.vllm)."""
    from omegaconf import OmegaConf

    kwargs = OmegaConf.load(config).actor_rollout_ref.rollout.engine_kwargs.vllm
    return {Reference("option", f"agl:{AGL_CONFIG}", "--" + str(k).replace("_", "-")) for k in kwargs}


def references(verl_root: Path) -> list[Reference]:
    """Every reference of verl (installed at `verl_root`, the package folder) to vLLM, sorted."""
    found: set[Reference] = set()
    for path in verl_files(verl_root):
        rel = path.relative_to(verl_root).as_posix()
        tree = ast.parse(path.read_text(errors="replace"))
        found |= file_references(tree, rel)
        if rel == EXTENSION[0]:
            found |= extension_references(tree, rel, EXTENSION[1])
        if rel == SERVER:
            found |= server_options(tree, rel)
        for (file, attribute), cls in RECEIVERS.items():
            if rel == file:
                found |= receiver_references(tree, rel, attribute, cls)
    return sorted(found)


class Tree:
    """A vLLM source tree (the folder holding `vllm/`), looked up without importing anything."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._parsed: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self._parsed:
            base = self.root.joinpath(*dotted.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            self._parsed[dotted] = ast.parse(path.read_text(errors="replace")) if path else None
        return self._parsed[dotted]

    def binding(self, dotted: str, name: str, depth: int = 0) -> tuple[str, object] | None:
        """What `name` is in module `dotted`: ("module", dotted), ("class", (module, ClassDef)), ("function", def),
        ("value", None); None when it is not there."""
        if self.module(f"{dotted}.{name}") is not None:
            return "module", f"{dotted}.{name}"
        tree = self.module(dotted)
        if tree is None or depth > DEPTH:
            return None
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return "class", (dotted, node)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return "function", node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(dotted, node, _is_pkg(self, dotted))
                        return self.binding(source, alias.name, depth + 1) or ("value", None)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        return "module", alias.name
            if name in _assigned(node):
                return "value", None
        return None

    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> tuple[str, object] | None:
        """What class `cls` of `module`, or a base it names, defines as `name`: ("function", def),
        ("class", (module, ClassDef)) or ("value", None); None when none defines it."""
        for node in _top_level(cls.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return "function", node
            if isinstance(node, ast.ClassDef) and node.name == name:
                return "class", (module, node)
        if name in _members(cls):
            return "value", None
        for base_module, base_cls in self._bases(module, cls, depth):
            found = self.member(base_module, base_cls, name, depth + 1)
            if found:
                return found
        return None

    def fields(self, module: str, cls: ast.ClassDef, depth: int = 0) -> set[str]:
        """The annotated attributes of a class and its bases (a dataclass's or a pydantic model's fields)."""
        names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for base_module, base_cls in self._bases(module, cls, depth):
            names |= self.fields(base_module, base_cls, depth + 1)
        return names

    def _bases(self, module: str, cls: ast.ClassDef, depth: int) -> Iterator[tuple[str, ast.ClassDef]]:
        if depth > DEPTH:
            return
        for base in cls.bases:
            parts = _chain(base)
            if not parts:
                continue
            found = self.binding(module, parts[0]) if len(parts) == 1 else self._walk(module, parts)
            if found and found[0] == "class":
                yield found[1]  # type: ignore[misc]

    def accepts(self, found: tuple[str, object], keywords: list[str]) -> list[str]:
        """The keywords a call of `found` (a function, or a class: its __init__ or its fields) would not take;
        [] also when the callable's parameters cannot be read statically (a value, a class built elsewhere)."""
        kind, value = found
        if kind == "class":
            module, cls = value  # type: ignore[misc]
            init = self.member(module, cls, "__init__")
            if init and init[0] == "function":
                return self.accepts(init, keywords)
            fields = self.fields(module, cls)
            return [k for k in keywords if k not in fields] if fields else []
        if kind != "function":
            return []
        args = value.args  # type: ignore[attr-defined]
        if args.kwarg:
            return []
        names = {a.arg for a in [*args.args, *args.kwonlyargs]}
        return [k for k in keywords if k not in names]

    def _walk(self, module: str, parts: list[str]) -> tuple[str, object] | None:
        found = self.binding(module, parts[0])
        for part in parts[1:]:
            if not found or found[0] != "module":
                return None
            found = self.binding(str(found[1]), part)
        return found

    def option(self, option: str) -> str:
        """`ok` when a `vllm serve` option is a field of the engine's or the frontend's arguments."""
        name = option.removeprefix("--").replace("-", "_")
        for module, cls in SERVE_ARGS:
            found = self.binding(module, cls)
            if found and found[0] == "class" and name in self.fields(*found[1]):  # type: ignore[misc]
                return "ok"
        return f"missing option {option}"

    def resolve(self, target: str) -> str:
        """`ok`, or `missing <what>`: the first part of the target this tree does not define."""
        if target.startswith("--"):
            return self.option(target)
        target, _, call = target.partition("(")
        dotted, _, rest = target.partition(":")
        if self.module(dotted) is None:
            return f"missing module {dotted}"
        current: tuple[str, object] = ("module", dotted)
        for part in rest.split(".") if rest else []:
            kind, value = current
            if kind == "module":
                found = self.binding(str(value), part)
                if found is None:
                    return f"missing {value}.{part}"
                current = found
            elif kind == "class":
                module, cls = value  # type: ignore[misc]
                dunder = part.startswith("__") and part.endswith("__")  # object's, when the class has none
                found = self.member(module, cls, part)
                if not found and not dunder:
                    return f"missing {module}.{cls.name}.{part}"
                current = found or ("value", None)
            else:
                current = ("value", None)  # read through a value (or a function): not checked statically
                break
        refused = self.accepts(current, call.rstrip(")").split(",")) if call.rstrip(")") else []
        return f"refuses {','.join(refused)}" if refused else "ok"


def _is_pkg(tree: Tree, dotted: str) -> bool:
    return tree.root.joinpath(*dotted.split("."), "__init__.py").is_file()


def _absolute(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if not is_pkg:
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _top_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Module statements, including those under `if`, `try` and `with` (TYPE_CHECKING blocks, fallbacks)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            yield from _top_level(
                [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
            )
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _assigned(node: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names: set[str] = set()
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    return names


def _members(cls: ast.ClassDef, owner: str | None = "self") -> set[str]:
    """Names a class body defines, and the attributes its methods set on `owner` (None: on any name, as verl's
    extension does on the instance it builds)."""
    names: set[str] = set()
    for node in _top_level(cls.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        names |= _assigned(node)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            parts = _chain(target) if isinstance(target, ast.Attribute) else None
            if parts and len(parts) == 2 and owner in (None, parts[0]):
                names.add(parts[1])
    return names


def record(refs: Iterable[Reference], tree: Tree) -> list[str]:
    """One line per reference: kind, verl file, target, and what the vLLM tree says."""
    return [f"{r.kind}\t{r.verl_file}\t{r.target}\t{tree.resolve(r.target)}" for r in refs]


def installed_package(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed in this interpreter: pass its source folder")
    return Path(next(iter(spec.submodule_search_locations)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-src", type=Path, required=True, help="the folder holding vllm/ (an unzipped wheel)")
    parser.add_argument("--verl-src", type=Path, default=None, help="verl's package folder (default: installed)")
    parser.add_argument("--agl-config", type=Path, default=Path(__file__).resolve().parents[1] / AGL_CONFIG)
    parser.add_argument("--write", type=Path, default=None, help="write the record here (with a header)")
    parser.add_argument("--header", default="", help="comment lines for the record's top")
    args = parser.parse_args(argv)
    refs = sorted({*references(args.verl_src or installed_package("verl")), *agl_options(args.agl_config)})
    lines = record(refs, Tree(args.vllm_src))
    text = "\n".join(lines) + "\n"
    if args.write:
        head = "".join(f"# {line}\n" for line in args.header.splitlines())
        args.write.write_text(head + text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
