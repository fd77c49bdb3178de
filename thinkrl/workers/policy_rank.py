"""The roles of one device: actor, reference, rollout engine and (PPO with a
critic) the critic, built from a spec.

A `PolicyRank` is a plain class. The local backend builds one in the
driver's process; the ray backend builds one per device inside a Ray actor
(`thinkrl.workers.ray_group`), all of them joined in one process group with
FSDP2-sharded models. Either way the roles are the same classes and each
rank builds its own models from the spec: the actor from the model path,
the reference from the same path again (the *initial* weights, whatever the
actor resumes), the engine on the actor's module (colocated: the optimizer
step is the weight sync, and a sharded module is gathered once per rollout),
the critic from critic.model.path (`thinkrl.workers.critic.build_critic`).

Only CPU tensors and plain values go in and come out (`RankSpec` and every
method's arguments and results).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from thinkrl.assets import run_stop_ids, sampling_seed
from thinkrl.checkpoint.state import device_rng_state, set_device_rng_state
from thinkrl.algos.distillation import DistillSettings
from thinkrl.config import Config
from thinkrl.config.distill_checks import Teacher
from thinkrl.config.moe_checks import router_replay_mode
from thinkrl.config.sizes import DerivedSizes
from thinkrl.models.loading import (causal_lm_skeleton, check_model_fits, load_causal_lm,
                                    load_generation_config)
from thinkrl.models.lora import (Lora, LoraSettings, attach_lora, load_adapter_weights, lora_of,
                                 merged_tensors)
from thinkrl.models.routing import install as install_route_tape, router_aux_coef
from thinkrl.models.vision import apply_model_settings, unsplit_modules
from thinkrl.parallel import fsdp
from thinkrl.parallel.device import (autocast, bind_rank_device, compute_dtype, empty_cache,
                                     frozen_weights_dtype, resolve_device)
from thinkrl.parallel.distributed import init_process_group
from thinkrl.records import PromptBatch, Rollouts
from thinkrl.rollout.attest import AttestShare, Ledger
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.workers.actor import ActorWorker
from thinkrl.workers.critic import build_critic
from thinkrl.workers.learner import actor_update_spec
from thinkrl.workers.mini_batches import MiniBatch
from thinkrl.workers.reference import ReferenceWorker

@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to build its roles (sent to Ray workers)."""

    cfg: Config
    sizes: DerivedSizes
    model_path: str
    """actor_rollout_ref.model.path with `builtin:` names resolved to folders."""
    total_steps: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    tokenizer_size: int
    """len(tokenizer): the ids the model must embed."""
    rank: int = 0
    world_size: int = 1
    init_method: str | None = None
    """torch.distributed rendezvous ("file://..." or "tcp://..."); None for one rank."""
    with_reference: bool = field(default=False)
    """Build the reference (a KL term needs it)."""
    device: str | None = None
    """The device kind ranks run on, decided once by the driver (trainer.device
    with "auto" resolved against the cluster's resources); None: trainer.device."""
    teachers: tuple[Teacher, ...] = ()
    """distillation.enabled: the frozen teachers, `builtin:` paths resolved."""

    @property
    def sampling_seed(self) -> int:
        return sampling_seed(self.cfg, rank=self.rank)

    @classmethod
    def of_model(cls, cfg: Config, sizes: DerivedSizes, model_path: str, tokenizer, *,
                 total_steps: int, with_reference: bool = False,
                 teachers: tuple[Teacher, ...] = ()) -> "RankSpec":
        """The spec of rank 0 for the model at `model_path` (its stop ids read
        from its generation config): one set-up for training and `thinkrl eval`."""
        trust = cfg.actor_rollout_ref.model.trust_remote_code
        stops = run_stop_ids(cfg, tokenizer, load_generation_config(model_path, trust))
        return cls(cfg=cfg, sizes=sizes, model_path=model_path, total_steps=total_steps,
                   eos_token_ids=tuple(stops), pad_token_id=tokenizer.pad_token_id,
                   tokenizer_size=len(tokenizer), with_reference=with_reference, teachers=teachers)


class PolicyRank:
    def __init__(self, spec: RankSpec) -> None:
        cfg, arr = spec.cfg, spec.cfg.actor_rollout_ref
        self.spec = spec
        sharded = spec.world_size > 1
        device_name = spec.device or cfg.trainer.device
        self.device = bind_rank_device(device_name) if sharded else resolve_device(device_name)
        offload = (self._offload(arr.actor.fsdp_config), self._offload(arr.ref.fsdp_config),
                   self._offload(cfg.critic.model.fsdp_config) and spec.sizes.critic is not None)
        if sharded:
            init_process_group(rank=spec.rank, world_size=spec.world_size,
                               init_method=spec.init_method, device=self.device,
                               timeout_s=cfg.trainer.ray_wait_timeout_s,
                               host_tensors=any(offload))
        torch.manual_seed(cfg.trainer.seed)
        dtype = compute_dtype(self.device, arr.model.dtype)
        self.autocast = autocast(self.device, dtype)
        self._base_to_attest: Ledger | None = None  # its base's digests, until the first sync checks them
        model = self._load(gradient_checkpointing=arr.model.enable_gradient_checkpointing,
                           dtype=dtype, param_offload=offload[0], weights_dtype=torch.float32,
                           lora=LoraSettings.of(arr.model))
        self.lora: Lora | None = lora_of(model)  # LoRA (model.lora_rank > 0): the actor's adapter
        self.replay = router_replay_mode(cfg)  # mixture of experts: R2 / R3 routes, on the actor's routers
        aux_coef = router_aux_coef(model)  # output_router_logits in the model's config: the routers' loss
        self.route_tape = install_route_tape(model) if self.replay != "disabled" or aux_coef else None
        sizes, rollout = spec.sizes, arr.rollout
        self.actor = ActorWorker(
            model, arr.actor, actor_update_spec(arr.actor, sizes), total_steps=spec.total_steps,
            log_prob_micro_batch_size=sizes.log_prob_micro_batch_size_per_device,
            temperature=rollout.temperature, autocast=self.autocast, device=self.device,
            remove_padding=arr.model.use_remove_padding, fused_head=arr.model.use_fused_kernels,
            log_prob_max_tokens=(rollout.log_prob_max_token_len_per_gpu
                                 if rollout.log_prob_use_dynamic_bsz else None),
            lora=self.lora, base_model=spec.model_path,
            distill=DistillSettings.of(cfg.distillation.distillation_loss) if spec.teachers else None,
            route_tape=self.route_tape, router_aux_coef=aux_coef)
        def frozen(path: str | None = None, adapter_off=None) -> ReferenceWorker:
            """A frozen model scored like the reference (its micro-batch, dynamic
            batch and offload keys): the reference itself, or a teacher at `path`.
            With `adapter_off` (LoRA) it is the actor's module, the adapter switched off."""
            held = model if adapter_off is not None else self._load(
                gradient_checkpointing=False, dtype=dtype, param_offload=offload[1],
                weights_dtype=frozen_weights_dtype(self.device, dtype), path=path)
            return ReferenceWorker(
                held, adapter_off=adapter_off, micro_batch_size=sizes.ref_log_prob_micro_batch_size_per_device,
                temperature=rollout.temperature, autocast=self.autocast, device=self.device,
                remove_padding=arr.model.use_remove_padding, fused_head=arr.model.use_fused_kernels,
                max_tokens=(arr.ref.log_prob_max_token_len_per_gpu if arr.ref.log_prob_use_dynamic_bsz else None))

        # LoRA: the actor's module with its adapter off is the base, exactly: no second copy.
        self.reference = (frozen(adapter_off=self.lora.disabled if self.lora is not None else None)
                          if spec.with_reference else None)
        # distillation.enabled: each teacher is a frozen model of its own path
        self.teachers = {teacher.name: frozen(teacher.model_path) for teacher in spec.teachers}
        # PPO with a critic (algorithm.adv_estimator=gae): the value model, else None.
        self.critic = (build_critic(spec, device=self.device, autocast=self.autocast,
                                    compute_dtype=dtype, param_offload=offload[2])
                       if spec.sizes.critic is not None else None)
        self.engine = self._engine(model, sharded=sharded)

    def _engine(self, model: torch.nn.Module, *, sharded: bool):
        """rollout.name=native samples from the actor's own module; vllm
        builds its engine here and takes the actor's weights at once (the
        engine may have started from dummy weights, or the actor may resume)."""
        spec, rollout = self.spec, self.spec.cfg.actor_rollout_ref.rollout
        if rollout.name == "vllm":
            from thinkrl.models.vision import is_vision_model
            from thinkrl.rollout.vllm_engine import VllmEngine
            from thinkrl.rollout.vllm_lora import adapter_serving
            vision = is_vision_model(spec.model_path)
            serves_adapter = self.lora is not None and adapter_serving(spec.cfg)[0]
            # The ranks of one tensor-parallel engine draw the same seeds.
            engine_index = spec.rank // rollout.tensor_model_parallel_size
            engine = VllmEngine.start(
                spec.cfg, model_path=spec.model_path,
                max_model_len=spec.sizes.prompt_length + spec.sizes.response_length,
                eos_token_ids=list(spec.eos_token_ids), pad_token_id=spec.pad_token_id,
                seed=sampling_seed(spec.cfg, rank=engine_index), device_kind=self.device.type,
                group_rank=(spec.rank, self._local_rank()) if sharded else None,
                vision_model=model if vision else None,
                lora_rank=spec.cfg.actor_rollout_ref.model.lora_rank if serves_adapter else 0)
            if serves_adapter:  # the frozen base once (its digests checked at the first sync)
                self._base_to_attest = engine.update_weights(self.actor.base_weights())
                # Installed now too: a caller may generate before the first sync (thinkrl eval).
                engine.update_adapter(self.actor.adapter_weights(), self.lora.scalings())
            else:
                engine.update_weights(self.actor.weights())
            return engine
        return NativeEngine(
            model, eos_token_ids=list(spec.eos_token_ids), pad_token_id=spec.pad_token_id,
            seed=spec.sampling_seed, autocast=self.autocast,
            gather=(lambda: fsdp.gathered(model)) if sharded else contextlib.nullcontext,
            device=self.device, route_tape=self.route_tape if self.replay == "R3" else None)

    def _local_rank(self) -> int:
        """This rank's index among the devices its process sees: 0 on an
        accelerator (Ray shows each rank only its own), its slot on the node
        on a CPU (vLLM binds threads by it)."""
        if self.device.type != "cpu":
            return 0
        return self.spec.rank % self.spec.cfg.trainer.n_gpus_per_node

    def sync_engine(self, share: AttestShare | None = None) -> tuple[Ledger, list[Ledger]] | None:
        """The actor's current weights into an engine that holds its own copy
        (a collective when sharded: every rank calls it), and the attestation:
        digests of what was sent and of what this rank's engine workers serve
        after the load (the units of `share`, when given: `thinkrl.rollout.attest`,
        checked by the driver). The native engine samples from the actor's
        module: nothing to sync (None)."""
        if isinstance(self.engine, NativeEngine):
            return None
        if not self.engine.lora_rank:
            sent = self.engine.update_weights(self.actor.weights(), share=share)
            return sent, self.engine.served(share=share)
        # The engine serves the adapter (`thinkrl.rollout.vllm_lora`): it alone changed. The
        # base, loaded once and never written again, is attested once, at the first sync.
        sent = self.engine.update_adapter(self.actor.adapter_weights(), self.lora.scalings())
        base, self._base_to_attest = self._base_to_attest, None
        if base is not None:
            sent = base.include(sent)
        return sent, self.engine.served(adapter_only=base is None)

    def _offload(self, fsdp_config) -> bool:
        """verl's three offload switches map onto FSDP2's CPUOffloadPolicy,
        which keeps parameters, gradients and optimizer state on the host
        together (and runs the optimizer step there); moot on a CPU device."""
        return fsdp_config.offloads and self.device.type != "cpu"

    def _load(self, *, gradient_checkpointing: bool, dtype: torch.dtype, param_offload: bool,
              weights_dtype: torch.dtype, lora: LoraSettings | None = None,
              path: str | None = None) -> torch.nn.Module:
        """The policy's architecture and initial weights (the actor's float32
        master weights, or the reference's) on this rank, in `weights_dtype`,
        computing in `dtype`: whole on one rank; sharded over several, read
        from disk by rank 0 alone, into host memory, and broadcast into the
        shards (`fsdp.build_model`). With `lora`, the adapters are attached
        before sharding (rank 0's initial or saved adapter is broadcast with the
        base; `lora_of` reads the handle from the model returned)."""
        spec, model_cfg = self.spec, self.spec.cfg.actor_rollout_ref.model
        model_path = path or spec.model_path
        options = dict(trust_remote_code=model_cfg.trust_remote_code,  # override_config: the policy's own
                       override_config=model_cfg.override_config if path is None else {},
                       gradient_checkpointing=gradient_checkpointing)

        def prepare(model: torch.nn.Module) -> None:
            check_model_fits(model, spec.tokenizer_size, spec.sizes, model_path=model_path)
            apply_model_settings(model, model_cfg)  # VL: model.freeze_vision_tower

        def with_lora(model: torch.nn.Module, *, read_adapter: bool) -> torch.nn.Module:
            if lora is not None:
                handle = attach_lora(model, lora)
                if read_adapter and lora.adapter_path is not None:  # model.lora_adapter_path
                    load_adapter_weights(handle, lora.adapter_path)
            return model

        def load(device: torch.device) -> torch.nn.Module:
            return with_lora(load_causal_lm(model_path, dtype=weights_dtype, device=device,
                                            **options), read_adapter=True)

        def shard(model: torch.nn.Module) -> None:
            fsdp.parallelize(model, compute_dtype=dtype, param_offload=param_offload,
                             whole=unsplit_modules(model, model_cfg))

        return fsdp.build_model(
            load, lambda: with_lora(causal_lm_skeleton(model_path, dtype=weights_dtype, **options),
                                    read_adapter=False),
            prepare=prepare, shard=shard, device=self.device, param_offload=param_offload)

    # The stages, as the driver calls them (through a handle under Ray).
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        return self.engine.generate(prompts, params)

    def compute_log_prob(self, input_ids, attention_mask, position_ids, model_inputs=None,
                         routed_experts=None, *, response_length: int) -> torch.Tensor:
        """The old log-probs; router replay: R3 replays `routed_experts`, R2 records its own."""
        return self.actor.compute_log_prob(input_ids, attention_mask, position_ids,
                                           response_length=response_length, model_inputs=model_inputs,
                                           routed_experts=routed_experts, record=self.replay == "R2")

    def take_recorded_routes(self) -> torch.Tensor | None:
        return self.actor.take_recorded_routes()

    def routing_counts(self) -> tuple[list[float], list[float]]:
        """(agreeing, replayed) tokens per layer since the last call (R3's old-log-prob passes)."""
        return self.route_tape.take_counts()

    def compute_ref_log_prob(self, input_ids, attention_mask, position_ids, model_inputs=None,
                             *, response_length: int) -> torch.Tensor:
        assert self.reference is not None, "built without a reference (no KL term)"
        return self.reference.compute_ref_log_prob(input_ids, attention_mask, position_ids,
                                                    response_length=response_length,
                                                    model_inputs=model_inputs)

    def compute_teacher_log_prob(self, input_ids, attention_mask, position_ids, model_inputs=None,
                                 *, response_length: int, teacher: str) -> torch.Tensor:
        """log pi_teacher of the response tokens under the teacher named `teacher`. [N, R]."""
        return self.teachers[teacher].compute_ref_log_prob(input_ids, attention_mask, position_ids,
                                                           response_length=response_length,
                                                           model_inputs=model_inputs)

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        metrics = self.actor.update_on(minis)
        empty_cache(self.device.type)  # the update's activations and gradients, for the engine
        return metrics

    def weight_stats(self) -> dict:
        return self.actor.weight_stats()

    # The critic's stages (PPO with a critic; thinkrl.workers.critic).
    def compute_values(self, input_ids, attention_mask, position_ids, *,
                       response_length: int) -> torch.Tensor:
        return self.critic.compute_values(input_ids, attention_mask, position_ids,
                                          response_length=response_length)

    def update_critic_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        return self.critic.update_on(minis)

    def save_critic(self, folder: str) -> None:
        self.critic.save(Path(folder))

    def load_critic(self, folder: str) -> None:
        self.critic.load(Path(folder))

    # Checkpoints: every rank writes its shards; any layout loads (ActorWorker.save/load).
    def save_actor(self, folder: str) -> None:
        self.actor.save(Path(folder))

    def load_actor(self, folder: str) -> None:
        self.actor.load(Path(folder))

    def schedule_state(self, role: str) -> dict:
        """The LR schedule of `role` ("actor" or "critic"); every rank holds the same."""
        return {"scheduler": getattr(self, role).learner.scheduler.state_dict()}

    def load_schedule_state(self, role: str, state: dict) -> None:
        getattr(self, role).learner.load_schedule(state["scheduler"])

    def generator_state(self) -> torch.Tensor:
        return self.engine.generator_state()

    def set_generator_state(self, state: torch.Tensor | None) -> None:
        """None (a resume onto more ranks than saved): this rank keeps its seed."""
        if state is not None:
            self.engine.set_generator_state(state)

    def device_rng_state(self) -> list[torch.Tensor] | None:
        return device_rng_state(self.device)

    def set_device_rng_state(self, state: list[torch.Tensor] | None) -> None:
        set_device_rng_state(state, self.device)

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The actor's full float32 weights on the CPU, on rank 0 (empty on
        the others). A collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)
        if not fsdp.is_sharded(self.actor.model):
            state = {k: v.detach().cpu().clone() for k, v in self.actor.model.state_dict().items()}
        else:
            state = get_model_state_dict(self.actor.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        if self.lora is not None and state:  # a plain model's names, the adapter merged in
            state = dict(merged_tensors(state.items(), self.lora.scalings()))
        return state

    def sharding(self) -> dict[str, int]:
        """Parameters held by this rank and in the whole model (for tests and logs)."""
        local = sum(getattr(p, "to_local", lambda: p)().numel()
                    for p in self.actor.model.parameters())
        return {"local": local, "total": sum(p.numel() for p in self.actor.model.parameters())}
