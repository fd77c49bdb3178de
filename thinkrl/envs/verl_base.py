"""verl's interaction base class, for interaction files run without verl
installed (`thinkrl.envs.verl_interaction.verl_base_importable`): the same
constructor, attributes, coroutines and defaults as
``verl.interactions.base.BaseInteraction``, so a subclass behaves as it would
under verl."""

from __future__ import annotations

import uuid
from typing import Any, Optional


class BaseInteraction:
    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs) -> str:
        """A new conversation's id (a fresh one when none is given)."""
        return instance_id if instance_id is not None else str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate_sequence, response_content, current_turn_score, additional_data)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self) -> float:
        return 0.0

    async def finalize_interaction(self) -> None:
        pass
