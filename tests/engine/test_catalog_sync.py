def test_served_architectures_match_the_engine_models():
    """The catalog, planner and engine check architectures against one torch-free table
    (`workers.protocol.architectures`); every name there has a model class, and the parallel
    stages build exactly the families it marks parallel."""
    from workers.engine.models import REGISTRY
    from workers.engine.parallel.launch import stage_class
    from workers.protocol.architectures import MLA_ARCHITECTURES, PARALLEL_ARCHITECTURES, SUPPORTED_ARCHITECTURES
    from workers.protocol.model_files import SUPPORTED_ARCHITECTURES as CATALOGS

    assert set(SUPPORTED_ARCHITECTURES) == set(REGISTRY) and CATALOGS is SUPPORTED_ARCHITECTURES
    assert {stage_class(name).__name__ for name in PARALLEL_ARCHITECTURES} == {"LlamaStage", "DeepseekStage"}
    assert {name for name in PARALLEL_ARCHITECTURES if stage_class(name).__name__ == "DeepseekStage"} == set(
        MLA_ARCHITECTURES
    )


def test_web_process_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE','controlplane.config.settings');"
        "django.setup(); import controlplane.config.urls, controlplane.config.asgi;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
