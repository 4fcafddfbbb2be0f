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
    """URI under which every stage directory lives: a local path or s3://bucket/prefix."""
    seed: int = 12345
    """Seed of every random choice; each draw is keyed by (seed, stage, shard or document, pass)."""

    @field_validator("root")
    @classmethod
    def _absolute_local_root(cls, value: str) -> str:
        if "://" in value:
            return value.rstrip("/")
        return str(Path(value).expanduser().resolve())


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
    """S3-compatible endpoint (MinIO, Ceph, moto); default: $AWS_ENDPOINT_URL (read when the config is loaded) or AWS itself."""
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


class RecipeLoader(yaml.SafeLoader):
    """YAML as recipes are written: `1e-4` is a number (YAML 1.2), not the string PyYAML's
    YAML 1.1 rules make of an exponent without a decimal point. Config types are strict,
    so a learning rate written that way would otherwise be refused."""


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


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
    if path in seen:
        raise ConfigError(f"{path}: `extends` makes a cycle ({' -> '.join(map(str, seen + (path,)))})")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=RecipeLoader) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})".replace("\n", " ")) from None
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
        node[parts[-1]] = yaml.load(raw, Loader=RecipeLoader)
    except yaml.YAMLError:
        node[parts[-1]] = raw


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `bertpipe run --help` lists the sections)"
        elif item["type"].endswith("_type") and not isinstance(item.get("input"), (dict, list)):
            message += f" (got {yaml.safe_dump(item.get('input'), default_flow_style=True).strip().removesuffix('...').strip()})"
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def validate(model: type[BaseModel], data: dict) -> Any:
    """Validate a recipe mapping against `model`; errors name the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_describe(exc)}") from None


def read_recipe(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """A recipe (with `extends`) as a mapping, with `--set` overrides applied."""
    data = _read_recipe(Path(path)) if path else {}
    for assignment in overrides:
        apply_override(data, assignment)
    return data


def resolved_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML, without secrets."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
