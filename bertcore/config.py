"""The run recipe: the sections every run has (run, ray, storage), and reading a recipe
from YAML with `extends` and `--set` overrides. The stage sections come from the stages
themselves; pipelines/registry.py assembles them into the whole recipe model.

A recipe may start with `extends: other.yaml` (a path relative to the recipe); its keys are
merged over the base recipe's, so recipes derive from each other by small overrides.
`--set a.b=value` overrides are applied last; values are parsed as YAML scalars.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from bertcore.errors import ConfigError
from bertcore.section import Section


class RunConfig(Section):
    """Where the run lives and how it is seeded."""

    root: str = "runs/demo"
    """URI under which every stage directory lives: a local path or s3://bucket/prefix; `~` and `$VAR` are expanded (an
    unset variable, an empty root and `/` are refused)."""
    seed: int = 12345
    """Seed of every random choice; each draw is keyed by (seed, stage, shard or document, pass)."""
    keep_scratch: bool = False
    """Keep a finished stage's scratch in the store (corpus `_work/` and `_dedup/`, examples `_tokens/`) instead of
    removing it once the stage's manifest is written. Removed (the default), what stays beside the shards is a few
    percent of them, and a rerun of the examples stage after a change of its own settings (masking, phases) tokenizes
    the corpus again; kept, that rerun reuses the token shards (about half the corpus shards' bytes)."""

    @field_validator("root", mode="before")
    @classmethod
    def _empty_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value  # `--set run.root=` parses as null

    @field_validator("root")
    @classmethod
    def _absolute_local_root(cls, value: str) -> str:
        return resolve_root(value)


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def resolve_root(value: str) -> str:
    """run.root as the pipeline uses it: `$VAR`/`${VAR}` and a leading `~` expanded, a local
    path made absolute; ValueError (naming what to do) for an empty root, an unset
    variable, or a root that is a whole file system (`/`, `s3://`)."""
    if not value.strip():
        raise ValueError("is empty; give a folder (e.g. runs/demo) or s3://bucket/prefix")
    expanded = os.path.expandvars(value)
    if unset := _VARIABLE.search(expanded):
        raise ValueError(
            f"{value!r}: the environment variable {unset.group(1).strip('{}')} is not set; set it or write the path out"
        )
    if "://" in expanded:
        scheme, _, rest = expanded.partition("://")
        if not rest.strip("/"):
            raise ValueError(
                f"{value!r} is a whole file system or bucket list; give a folder inside it (e.g. "
                f"{scheme}://bucket/runs)"
            )
        return expanded.rstrip("/")
    resolved = Path(expanded).expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise ValueError(f"{value!r} is the file system's root; give a folder for the run (e.g. runs/demo)")
    return str(resolved)


class RayConfig(Section):
    """How Ray is reached."""

    address: str = ""
    """Empty: start an embedded local Ray; otherwise an address such as `auto` or `ray://head:10001`."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the embedded local Ray (None: all of this machine's); ignored when joining a cluster."""
    parallelism: int | None = Field(None, ge=1)
    """Most Ray tasks of one stage in flight at once (None: no limit beyond the cluster's CPUs)."""


class StorageConfig(Section):
    """Object-store settings passed to fsspec. Credentials normally come from the environment
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...); they are never logged or
    written to manifests or resolved configs."""

    endpoint_url: str | None = Field(None, validate_default=True)
    """S3-compatible endpoint (MinIO, Ceph, moto); default: $AWS_ENDPOINT_URL (read when the config is loaded) or AWS
    itself."""
    region: str | None = None
    """S3 region; default: from the environment."""
    anon: bool = False
    """Anonymous (unsigned) S3 access, for public buckets."""
    key: SecretStr | None = Field(None, exclude=True)
    """Access key id, if not in the environment (never written out)."""
    secret: SecretStr | None = Field(None, exclude=True)
    """Secret access key, if not in the environment (never written out)."""

    @field_validator("endpoint_url", mode="before")
    @classmethod
    def _endpoint_from_environment(cls, value: str | None) -> str | None:
        # resolved here, on the driver, so Ray workers on any node use the same endpoint
        return value or os.environ.get("AWS_ENDPOINT_URL") or None

    def fsspec_options(self, protocol: str) -> dict[str, Any]:
        """Keyword arguments for `fsspec.filesystem(protocol, ...)`."""
        if protocol not in ("s3", "s3a"):
            return {}
        options: dict[str, Any] = {"anon": self.anon}
        client: dict[str, Any] = {}
        if self.endpoint_url:
            client["endpoint_url"] = self.endpoint_url
        if self.region:
            client["region_name"] = self.region
        if client:
            options["client_kwargs"] = client
        if self.key is not None:
            options["key"] = self.key.get_secret_value()
        if self.secret is not None:
            options["secret"] = self.secret.get_secret_value()
        return options


class RecipeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """YAML as recipes are written: `1e-4` is a number (YAML 1.2), not the string PyYAML's
    YAML 1.1 rules make of an exponent without a decimal point. Config types are strict,
    so a learning rate written that way would otherwise be refused."""


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

MAX_RECIPE_BYTES = 256 << 10
"""A recipe file larger than this is refused: real recipes are a few kilobytes, and parsing
this much YAML already takes about half a second of CPU."""


MAX_EXTENDS = 16
"""Recipes an `extends` chain may hold."""


def _shared_container(data: Any) -> bool:
    """Whether a list or mapping occurs twice in `data`: what a YAML alias (`*name`) makes.
    Stops at the first repeat, so a "billion laughs" recipe is found in linear time."""
    seen: set[int] = set()
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            if id(node) in seen:
                return True
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return False


def load_yaml(text: str, where: str) -> Any:
    """Parse recipe YAML; ConfigError (naming `where`) for invalid YAML or an alias to a
    list or mapping (a few hundred bytes of aliases can stand for billions of values)."""
    try:
        data = yaml.load(text, Loader=RecipeLoader)
    except RecursionError:
        raise ConfigError(f"{where}: lists or mappings nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(exc).split())[:300]})") from None
    if _shared_container(data):
        raise ConfigError(
            f"{where}: YAML aliases (*name) of lists or mappings are not allowed in recipes; write the value "
            "out, or use `extends`"
        )
    return data


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if len(seen) >= MAX_EXTENDS:
        raise ConfigError(f"{path}: `extends` goes {MAX_EXTENDS} recipes deep; at most {MAX_EXTENDS} are followed")
    if path in seen:
        raise ConfigError(f"{path}: `extends` makes a cycle ({' -> '.join(map(str, seen + (path,)))})")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a regular file")
    if path.stat().st_size > MAX_RECIPE_BYTES:
        raise ConfigError(
            f"{path}: {path.stat().st_size:,} bytes; a recipe may hold at most {MAX_RECIPE_BYTES:,} (256 KiB)"
        )
    try:
        text = path.read_bytes()[: MAX_RECIPE_BYTES + 1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    data = load_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    base = data.pop("extends", None)
    if base is None:
        return data
    return _merge(_read_recipe(path.parent / base, seen + (path,)), data)


def apply_override(data: dict, assignment: str) -> None:
    """Apply one `dotted.key=value` override in place; the value is parsed as YAML."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. examples.max_seq_length=512")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        node = child
    try:
        value = yaml.load(raw, Loader=RecipeLoader)
    except yaml.YAMLError:
        value = raw
    if _shared_container(value):
        raise ConfigError(
            f"--set {key}: YAML aliases (*name) of lists or mappings are not allowed; write the value out"
        )
    node[parts[-1]] = value


MAX_ERRORS = 5
"""Validation errors named in the message at most (the count of the others follows)."""


def _short(text: str, limit: int) -> str:
    text = " ".join(text[: limit * 4].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_errors(error: ValidationError) -> str:
    """One line for a ValidationError: the dotted key and the problem of its first few
    errors, each cut short. Never `str(error)`, which prints every input in full (a recipe
    that nests lists deeply, or shares them, would take minutes to format)."""
    items = error.errors(include_url=False)
    lines = []
    for item in items[:MAX_ERRORS]:
        where = _short(".".join(str(p) for p in item["loc"]) or "(top level)", 200)
        message = _short(item["msg"].removeprefix("Value error, "), 400)
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `bertpipe run --help` lists the sections)"
        elif item["type"].endswith("_type") and not isinstance(item.get("input"), (dict, list)):
            shown = item.get("input")
            shown = shown[:80] + "..." if isinstance(shown, str) and len(shown) > 80 else shown
            message += (
                " (got "
                f"{yaml.safe_dump(shown, default_flow_style=True, width=1 << 20).strip().removesuffix('...').strip()})"
            )
        lines.append(f"{where}: {message}")
    if len(items) > MAX_ERRORS:
        lines.append(f"and {len(items) - MAX_ERRORS} more")
    return "; ".join(lines)


def validate(model: type[BaseModel], data: dict) -> Any:
    """Validate a recipe mapping against `model`; errors name the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {describe_errors(exc)}") from None


def read_recipe(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """A recipe (with `extends`) as a mapping, with `--set` overrides applied."""
    data = _read_recipe(Path(path)) if path else {}
    for assignment in overrides:
        apply_override(data, assignment)
    return data


def resolved_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML, without secrets."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
