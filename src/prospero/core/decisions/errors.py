"""What deciding can fail with (the API maps them to 404 / 409 / 400)."""

from __future__ import annotations

from prospero.core.errors import Conflict, NotFound, ProsperoError


class DecisionNotFound(NotFound):
    def __init__(self, decision_id: str) -> None:
        super().__init__(f"decision '{decision_id}' not found")
        self.decision_id = decision_id


class DecisionConflict(Conflict):
    """The decision cannot be decided (any more): someone else answered, it expired or was
    cancelled, or its request is not live in this process."""


class UnknownOption(ProsperoError):
    """The option id is not one the agent offered (the API answers 400)."""

    kind = "invalid_option"
