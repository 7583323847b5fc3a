"""/v1/*: the OpenAI-compatible API (openai/; its Files and Batch API: controlplane/batches), its
Responses API (responses/), Anthropic's Messages
API (anthropic/) and vLLM's tokenize/detokenize (tokenize/, also at /tokenize and /detokenize, where
vLLM serves them)."""

from django.urls import path, re_path

from controlplane.batches import views as batch_views
from controlplane.gateway.dialects.anthropic import views as anthropic_views
from controlplane.gateway.dialects.openai import views as openai_views
from controlplane.gateway.dialects.responses import views as responses_views
from controlplane.gateway.dialects.tokenize import views as tokenize_views

urlpatterns = [
    path("models", openai_views.list_models, name="openai-models"),
    path("models/<str:model_id>", openai_views.retrieve_model, name="openai-model"),
    path("completions", openai_views.completions, name="openai-completions"),
    path("chat/completions", openai_views.chat_completions, name="openai-chat-completions"),
    path("responses", responses_views.create_response, name="openai-responses"),
    path("responses/<str:rid>", responses_views.response_detail, name="openai-response"),
    path("messages", anthropic_views.messages, name="anthropic-messages"),
    path("messages/count_tokens", anthropic_views.count_tokens, name="anthropic-count-tokens"),
    path("files", batch_views.files, name="openai-files"),
    path("files/<str:file_id>", batch_views.file_detail, name="openai-file"),
    path("files/<str:file_id>/content", batch_views.file_content, name="openai-file-content"),
    path("batches", batch_views.batches, name="openai-batches"),
    path("batches/<str:batch_id>", batch_views.batch_detail, name="openai-batch"),
    path("batches/<str:batch_id>/cancel", batch_views.batch_cancel, name="openai-batch-cancel"),
    path("tokenize", tokenize_views.tokenize, name="openai-tokenize"),
    path("detokenize", tokenize_views.detokenize, name="openai-detokenize"),
    re_path(r"^(?P<path>.*)$", openai_views.not_found),
]
