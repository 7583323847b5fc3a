from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0002_replica_progress'),
    ]

    operations = [
        migrations.AddField(
            model_name='replica',
            name='last_event_ns',
            field=models.BigIntegerField(default=0, help_text='when its agent sent the last message applied (older ones arrive late and are ignored)'),
        ),
    ]
