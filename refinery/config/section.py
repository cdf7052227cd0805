"""The base of every config section: typed fields, unknown keys refused, values frozen."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
