"""A simulated user written for verl, as a verl user's file would be: it
imports verl's base class (thinkrl makes that one import work without
verl) and answers through verl's coroutines. It checks the last assistant
turn's "#### n" line and asks for another try when it is wrong."""

import re
import uuid

from verl.interactions.base import BaseInteraction


class SumsInteraction(BaseInteraction):
    def __init__(self, config: dict):
        super().__init__(config)
        self._instance_dict = {}
        self.finalized = []

    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs):
        if instance_id is None:
            instance_id = str(uuid.uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth,
                                            "name": kwargs.get("name")}
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        last = next(m["content"] for m in reversed(messages) if m["role"] == "assistant")
        self._instance_dict[instance_id]["response"] = last
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, "Your response is correct!", reward, {}
        return False, "Your response is incorrect! Try again.", reward, {}

    async def calculate_score(self, instance_id, **kwargs):
        state = self._instance_dict[instance_id]
        found = re.findall(r"#### (-?\d+)", state["response"])
        return 1.0 if found and found[-1] == str(state["ground_truth"]) else 0.0

    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(instance_id)
        del self._instance_dict[instance_id]
