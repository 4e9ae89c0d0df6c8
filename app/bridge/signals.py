"""``EngineSignals``: every engine -> GUI event, on one QObject that the bridge owns."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal


class EngineSignals(QObject):
    """Engine -> GUI events. Emitted from pool threads; receivers run in the GUI thread.

    The bridge creates it without a parent and every engine loop holds a reference to it, so it outlives the
    loops even when the window (and the bridge with it) is deleted first: an emit never meets a deleted source.

    Signals:
        token_delta(request_id, text): new text of a streaming reply.
        request_finished(request_id, RequestInfo): a reply ended (stop, length or abort).
        request_failed(request_id, message): a request could not run, failed while generating, or was dropped.
        context_fitted(request_id, int): before its reply, how many messages of a chat were left out to fit the
            context (sent only when some were).
        model_load_progress(fraction, stage): loader progress, 0..1.
        model_loaded(ModelInfo): a model is ready for requests.
        model_load_failed(message): loading (or connecting) failed; the message is meant for the user. When it
            failed before anything changed (a mistyped path, an unreachable server), the model in use stays:
            ``EngineBridge.model_info`` still names it, and "Serve on localhost" keeps serving it.
        model_unloaded(): the model was freed after ``unload_model``.
        metrics_updated(dict): about once a second each, the engine loop's metrics snapshot
            (``EngineMetrics.to_dict()``) and the resource monitor's sample (memory, CPU, GPUs; with a remote
            server's figures while one is in use). Both carry ``time``; ``types.engine_metrics_in`` and
            ``types.resource_figures_in`` read the two parts.
        hardware_detected(HardwareInfo | None): result of ``detect_hardware``.
        error(message): an unexpected engine error, such as the engine loop stopping.
        remote_models_listed(list[str]): the models a remote server offers, after ``connect_remote``.
        server_state_changed(ServerState): "Serve on localhost" started, stopped or failed.
        recommendation_ready(QuantizationAdvice): result of ``recommend_quantization``.
        models_discovered(list[dict]): result of ``discover_models``: each model found on disk, as
            ``engine.loading.describe.FoundModel.to_json()``.
        model_folders_unreadable(list[str]): the places ``discover_models`` could not read ("folder: why"),
            emitted just before ``models_discovered``; empty when every one was read.
        model_folders_scanned(list[str]): after ``models_discovered``, the folders that scan looked in and the ones
            inside them where models sit (``app.bridge.model_folders``), for the Models list to watch.
        tool_step(request_id, ToolStepRecord): a tools reply's call ran, failed or was denied
            (``app.bridge.tool_runs``).
        tools_measured(key, ToolsMeasure): result of ``measure_tools``: a chat's tools and their prompt tokens.
        native_build_changed(NativeBuild): after a load, the engine's native decode step is being built (the model
            runs without it meanwhile), then it is ready or failed (``app.bridge.native_build``).
    """

    token_delta = Signal(str, str)
    context_fitted = Signal(str, int)
    request_finished = Signal(str, object)
    request_failed = Signal(str, str)
    model_load_progress = Signal(float, str)
    model_loaded = Signal(object)
    model_load_failed = Signal(str)
    model_unloaded = Signal()
    metrics_updated = Signal(object)
    hardware_detected = Signal(object)
    error = Signal(str)
    remote_models_listed = Signal(object)
    server_state_changed = Signal(object)
    recommendation_ready = Signal(object)
    models_discovered = Signal(object)
    model_folders_unreadable = Signal(object)
    model_folders_scanned = Signal(object)
    tool_step = Signal(str, object)
    tools_measured = Signal(object, object)
    native_build_changed = Signal(object)
