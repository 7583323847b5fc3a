from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='last_report_ns',
            field=models.BigIntegerField(default=0, help_text='when its agent made the last report applied (a late, older one is ignored)'),
        ),
    ]
