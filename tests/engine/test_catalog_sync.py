def test_served_architectures_match_the_engine_models():
    """The catalog and the engine check architectures against `workers.protocol.model_files` (no
    torch); every name there must have a model class."""
    from workers.engine.models import REGISTRY
    from workers.protocol.model_files import SUPPORTED_ARCHITECTURES

    assert set(SUPPORTED_ARCHITECTURES) == set(REGISTRY)


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
