"""/v1/*: the OpenAI-compatible API (see openai_views)."""

from django.urls import path, re_path

from controlplane.gateway import openai_views

urlpatterns = [
    path("models", openai_views.list_models, name="openai-models"),
    path("models/<str:model_id>", openai_views.retrieve_model, name="openai-model"),
    path("completions", openai_views.completions, name="openai-completions"),
    path("chat/completions", openai_views.chat_completions, name="openai-chat-completions"),
    re_path(r"^(?P<path>.*)$", openai_views.not_found),
]
