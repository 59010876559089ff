"""The CLI's own OpenTelemetry set-up, from the standard ``OTEL_*`` variables.

An application configures the SDK itself; the ``effectlog`` command does it here when
``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set. ``console`` writes one JSON object per span (or per metrics export) to stderr, so
``--json`` output on stdout stays clean; ``otlp`` needs ``opentelemetry-exporter-otlp``
(never a dependency of effectlog). Telemetry never stops a command: what cannot be set
up is said in one line on stderr and the command runs without it.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    return any(environ.get(name, "").strip() for name in VARIABLES)


def _say(text: str) -> None:
    sys.stderr.write(f"effectlog: telemetry: {text}\n")
    sys.stderr.flush()


def _names(environ: Mapping[str, str], variable: str) -> list[str]:
    given = environ.get(variable, "").strip()
    if not given:  # only the endpoint: OTLP, as the SDK's own auto-configuration does
        return ["otlp"] if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() else []
    return [n.strip().lower() for n in given.split(",") if n.strip() and n.strip().lower() != "none"]


def _otlp(environ: Mapping[str, str], signal: str) -> Any:
    """The OTLP exporter class for ``signal`` ("trace" or "metric"), or None when it is not installed."""
    import importlib

    protocol = environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").strip().lower()
    transport = "grpc" if protocol == "grpc" else "http"
    module = f"opentelemetry.exporter.otlp.proto.{transport}.{signal}_exporter"
    try:
        found = importlib.import_module(module)
    except ImportError:
        _say(f"OTLP {signal}s need opentelemetry-exporter-otlp (pip install opentelemetry-exporter-otlp); not exported")
        return None
    return getattr(found, "OTLPSpanExporter" if signal == "trace" else "OTLPMetricExporter")


def configure(environ: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """Set the global tracer and meter providers from ``environ``; returns what flushes and shuts them down."""
    if not wanted(environ):
        return None
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        _say("OTEL_* variables are set but the OpenTelemetry SDK is not installed (pip install 'effectlog[otel]')")
        return None
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "") or "effectlog"})
    closers: list[Callable[[], Any]] = []
    spans = _names(environ, "OTEL_TRACES_EXPORTER")
    if spans:
        tracer_provider = TracerProvider(resource=resource)
        for name in spans:
            if name == "console":
                # Simple (not batched): each span is written when it ends, so a crash loses none.
                exporter = ConsoleSpanExporter(out=sys.stderr, formatter=lambda s: s.to_json(indent=None) + "\n")
                tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
            elif name == "otlp":
                made = _otlp(environ, "trace")
                if made is not None:
                    tracer_provider.add_span_processor(BatchSpanProcessor(made()))
            else:
                _say(f"OTEL_TRACES_EXPORTER={name}: unknown exporter (console, otlp or none); not exported")
        trace.set_tracer_provider(tracer_provider)
        closers.append(tracer_provider.shutdown)
    readers: list[Any] = []
    for name in _names(environ, "OTEL_METRICS_EXPORTER"):
        if name == "console":
            console = ConsoleMetricExporter(out=sys.stderr, formatter=lambda m: m.to_json(indent=None) + "\n")
            readers.append(PeriodicExportingMetricReader(console, export_interval_millis=_interval(environ)))
        elif name == "otlp":
            made = _otlp(environ, "metric")
            if made is not None:
                readers.append(PeriodicExportingMetricReader(made(), export_interval_millis=_interval(environ)))
        else:
            _say(f"OTEL_METRICS_EXPORTER={name}: unknown exporter (console, otlp or none); not exported")
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        closers.append(meter_provider.shutdown)

    def shutdown() -> None:
        for close in closers:  # shutting down exports what is still buffered (the last metrics)
            close()

    return shutdown


def _interval(environ: Mapping[str, str]) -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` in ms; what the SDK would refuse (not a number, not finite, not
    above zero: a ValueError out of the reader, a traceback stopping the command) or could not wait
    (longer than ``threading.TIMEOUT_MAX``: an OverflowError killing its export thread) is said, and
    60 s used."""
    given = environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    if not given:
        return 60000.0
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= threading.TIMEOUT_MAX * 1000):
        _say(f"OTEL_METRIC_EXPORT_INTERVAL={given}: not a positive number of milliseconds; 60000 used")
        return 60000.0
    return value
