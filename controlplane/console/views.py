"""Serves the built admin console (frontend/dist) at / and its session login API.

Every path the console routes itself (/deployments, /playground...) gets index.html; its
assets come from /assets/. The console talks to the REST API with the Django session, so
login/logout/me live here, with CSRF (the console sends the csrftoken cookie back as a header;
`me` and the page itself set that cookie).
"""

from pathlib import Path

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.http import FileResponse, Http404, HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.static import serve
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

DIST = Path(settings.BASE_DIR) / "frontend" / "dist"


@ensure_csrf_cookie
def spa(request, path: str = ""):
    index = DIST / "index.html"
    if not index.is_file():
        return HttpResponse(
            "<h1>The console is not built</h1><p>Run <code>make setup</code> (it runs <code>npm ci && npm run "
            "build</code> in <code>frontend/</code>). The REST API is at <a href='/api/docs/'>/api/docs/</a>.</p>",
            status=503,
        )
    return FileResponse(index.open("rb"), content_type="text/html")


def assets(request, path: str):
    if not (DIST / "assets").is_dir():
        raise Http404("the console is not built")
    return serve(request, path, document_root=DIST / "assets")


def _user(user) -> dict:
    return {"username": user.get_username(), "is_staff": user.is_staff}


USER = inline_serializer("ConsoleUser", {"username": serializers.CharField(), "is_staff": serializers.BooleanField()})


class LoginView(APIView):
    permission_classes = [AllowAny]

    def initial(self, request, *args, **kwargs):
        # DRF exempts its views from Django's CSRF middleware and checks CSRF only for a request
        # already signed in; a login must be checked too, or another site can sign a browser in
        # as the attacker's account (login CSRF). Refused: 403 with DRF's error body.
        super().initial(request, *args, **kwargs)
        SessionAuthentication().enforce_csrf(request._request)

    @extend_schema(
        operation_id="auth_login",
        request=inline_serializer("Login", {"username": serializers.CharField(), "password": serializers.CharField()}),
        responses={200: USER},
    )
    def post(self, request):
        username, password = request.data.get("username"), request.data.get("password")
        if not username or not password:
            return Response({"detail": "Enter a username and a password."}, status=status.HTTP_400_BAD_REQUEST)
        user = authenticate(request, username=username, password=password)
        if user is None:
            return Response({"detail": "Wrong username or password."}, status=status.HTTP_400_BAD_REQUEST)
        login(request, user)
        return Response(_user(user))


class LogoutView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(operation_id="auth_logout", request=None, responses={204: None})
    def post(self, request):
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(operation_id="auth_me", responses={200: USER})
    @method_decorator(ensure_csrf_cookie)  # the login form sends this cookie back
    def get(self, request):
        if not request.user.is_authenticated:
            return Response({"detail": "Not signed in."}, status=status.HTTP_401_UNAUTHORIZED)
        return Response(_user(request.user))
