from rest_framework.permissions import SAFE_METHODS, BasePermission


class StaffWritesOrReadOnly(BasePermission):
    """Any signed-in user reads; only staff change anything."""

    message = "Only staff users can change this resource."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or user.is_staff
