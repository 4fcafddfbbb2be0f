"""The run recipe: one pydantic model per section, loaded from YAML with overrides.

A recipe may start with `extends: other.yaml` (a path relative to the recipe); its keys are
merged over the base recipe's, so recipes derive from each other by small overrides.
`--set a.b=value` overrides are applied last; values are parsed as YAML scalars.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator

from bertcore.errors import ConfigError
from bertcore.section import Section
from bertcore.eval.config import EvaluateConfig
from bertcore.examples import ExamplesConfig
from bertcore.text.config import CorpusConfig
from bertcore.tokenizer import VocabConfig
from bertcore.train import PretrainConfig


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


class PipelineConfig(Section):
    """A whole run: one section per stage plus run, ray and storage."""

    run: RunConfig = Field(default_factory=RunConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    corpus: CorpusConfig
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    examples: ExamplesConfig = Field(default_factory=ExamplesConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)


STAGES = ("corpus", "vocab", "examples", "pretrain", "evaluate")
"""Stage names in flow order."""


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
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
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
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError:
        node[parts[-1]] = raw


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `bertpipe run --help` lists the sections)"
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def parse_config(data: dict) -> PipelineConfig:
    """Validate a recipe mapping; errors name the dotted key."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_describe(exc)}") from None


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Read a recipe (with `extends`), apply `--set` overrides and validate."""
    data = _read_recipe(Path(path)) if path else {}
    _expand_input_placeholders(data)
    for assignment in overrides:
        apply_override(data, assignment)
    return parse_config(data)


def _expand_input_placeholders(data: dict) -> None:
    """Input paths are relative to the working directory, like any command-line tool's;
    `{demo_data}` and `{korean_data}` expand to the folders of the bundled sample data."""
    corpus = data.get("corpus")
    if not isinstance(corpus, dict):
        return
    inputs = corpus.get("inputs")
    if not isinstance(inputs, list):
        return
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            inputs[index] = expand_placeholders(item)
        elif isinstance(item, dict) and isinstance(item.get("uri"), str):
            item["uri"] = expand_placeholders(item["uri"])


def expand_placeholders(uri: str) -> str:
    if "{demo_data}" in uri or "{korean_data}" in uri:
        from bertcore import sample_data

        uri = uri.replace("{demo_data}", str(sample_data.gensim_data_dir()))
        uri = uri.replace("{korean_data}", str(sample_data.konlpy_corpus_dir()))
    return uri


def resolved_yaml(cfg: PipelineConfig) -> str:
    """The resolved config as YAML, without secrets."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
