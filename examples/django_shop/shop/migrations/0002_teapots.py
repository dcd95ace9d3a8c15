from django.db import migrations


def stock(apps, schema_editor):
    apps.get_model("shop", "Product").objects.create(id=1, name="teapot", price_cents=2500, stock=3)


class Migration(migrations.Migration):
    dependencies = [("shop", "0001_initial")]
    operations = [migrations.RunPython(stock, migrations.RunPython.noop)]
