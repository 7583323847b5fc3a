def test_catalog_architectures_match_the_engine():
    """The web process validates architectures without importing the engine (torch); keep the
    two lists equal."""
    from controlplane.catalog.validation import SUPPORTED_ARCHITECTURES
    from workers.engine.models import REGISTRY

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
