"""Management tokens used to be DRF's `authtoken` rows, secrets in plaintext. They are dropped,
not carried over: they sat in a world-readable database file, so treat them as leaked and
create new ones with `manage.py create_token` (README, "Management API tokens")."""

from django.db import migrations


def forget_authtoken_types(apps, schema_editor):
    # Their permissions go with them (cascade).
    apps.get_model("contenttypes", "ContentType").objects.filter(app_label="authtoken").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunSQL("DROP TABLE IF EXISTS authtoken_token", reverse_sql=migrations.RunSQL.noop),
        migrations.RunPython(forget_authtoken_types, migrations.RunPython.noop),
    ]
