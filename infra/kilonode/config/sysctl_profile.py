"""Sysctl profiles: data files in sysctl/, one value and one reason per key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, RootModel


class SysctlEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: int | str
    reason: str = Field(min_length=10)


class SysctlProfile(RootModel[dict[str, SysctlEntry]]):
    """Keyed by sysctl name, in file order."""

    model_config = ConfigDict(frozen=True)
