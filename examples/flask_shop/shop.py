"""A small shop that keeps its job queue in its own database (issue 16's example).

Placing an order writes the order, enqueues its `export_orders` job and takes the stock in one
Flask-SQLAlchemy transaction: the job exists exactly when the order does. The queue's dashboard
is mounted at /jobs-admin behind the shop's own staff login.

    JOBQUEUE_DATABASE_URL=mysql+pymysql://shop@db/shop SHOP_SECRET_KEY=... \\
        gunicorn --chdir examples/flask_shop -c python:jobqueue.web.gunicorn_conf 'shop:create_app()'

(the queue's gunicorn settings start the embedded workers in each web process, as for
`jobqueue serve`). Staff come from SHOP_STAFF: `name:role:password-hash` entries separated by
';', role `admin`, `viewer` or `none` (may sign in to the shop, not to the dashboard).
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, current_app, flash, redirect, render_template, request, session, url_for
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import CheckConstraint, String, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from werkzeug.security import check_password_hash

from jobqueue import JobQueue
from jobqueue.core.builtin_tasks import export_orders
from jobqueue.web import init_dashboard


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Product(db.Model):
    __tablename__ = "shop_product"
    __table_args__ = (CheckConstraint("stock >= 0", name="shop_product_stock"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(80))
    price_cents: Mapped[int]
    stock: Mapped[int]


class Order(db.Model):
    __tablename__ = "shop_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(80))
    product_id: Mapped[int]
    quantity: Mapped[int]
    amount_cents: Mapped[int]


class OutOfStock(Exception):
    pass


def parse_staff(text: str) -> dict[str, tuple[str | None, str]]:
    staff = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        name, role, password_hash = entry.split(":", 2)
        staff[name] = (None if role == "none" else role, password_hash)
    return staff


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=os.environ.get("SHOP_SECRET_KEY"),
        SQLALCHEMY_DATABASE_URI=os.environ.get("JOBQUEUE_DATABASE_URL"),
        SHOP_STAFF=parse_staff(os.environ.get("SHOP_STAFF", "")),
    )
    app.config.update(config or {})
    # One database for the shop and its queue: that is what makes the order and its job one
    # transaction. (init_dashboard reads JOBQUEUE_* settings from here, else the environment.)
    app.config.setdefault("JOBQUEUE_DATABASE_URL", app.config["SQLALCHEMY_DATABASE_URI"])
    db.init_app(app)
    CSRFProtect(app)  # before init_dashboard: it exempts the queue's API (bearer tokens) from it
    with app.app_context():
        app.extensions["shop_queue"] = JobQueue(db.engine)  # the shop's own pool
    init_dashboard(app, "/jobs-admin", authorize=dashboard_role, user_name=lambda req: session["staff"])
    app.register_blueprint(_routes(app))
    return app


def dashboard_role(req) -> str | None:
    """The shop's answer to "may this request see the job dashboard?": staff sign in first."""
    name = session.get("staff")
    if name not in current_app.config["SHOP_STAFF"]:
        abort(redirect(url_for("shop.login", next=req.path)))
    return current_app.config["SHOP_STAFF"][name][0]


def place_order(customer: str, product_id: int, quantity: int) -> Order:
    """The order, its export job and the stock it takes, in one transaction. The contended row
    (the product's stock) is locked last, so it is held for the shortest time."""
    product = db.session.get(Product, product_id)
    if product is None:
        abort(404)
    order = Order(
        customer=customer, product_id=product_id, quantity=quantity, amount_cents=quantity * product.price_cents
    )
    db.session.add(order)
    db.session.flush()  # the order's id, for its job's key
    queue: JobQueue = current_app.extensions["shop_queue"]
    queue.enqueue(
        export_orders,
        f"order-{order.id}",
        {"orders": [{"id": order.id, "amount": f"{order.amount_cents / 100:.2f}"}]},
        conn=db.session,
    )
    taken = db.session.execute(
        update(Product)
        .where(Product.id == product_id, Product.stock >= quantity)
        .values(stock=Product.stock - quantity)
    )
    if taken.rowcount != 1:
        raise OutOfStock(product.name)
    db.session.commit()  # the order and its job, together
    return order


def _routes(app: Flask):
    from flask import Blueprint

    bp = Blueprint("shop", __name__)

    @bp.get("/")
    def index():
        return render_template("order.html", products=db.session.scalars(db.select(Product)).all())

    @bp.post("/orders")
    def order():
        customer = (request.form.get("customer") or "").strip()[:80]
        try:
            product_id, quantity = int(request.form["product"]), int(request.form["quantity"])
        except (KeyError, ValueError):
            abort(400)
        if not customer or not 1 <= quantity <= 100:
            abort(400)
        try:
            placed = place_order(customer, product_id, quantity)
        except OutOfStock as exc:
            db.session.rollback()  # no order, and no job for it
            flash(f"Sorry, not enough {exc} left.")
            return redirect(url_for("shop.index"), 303)
        flash(f"Order {placed.id} placed.")
        return redirect(url_for("shop.index"), 303)

    @bp.route("/login", methods=["GET", "POST"])
    def login():
        if request.method == "POST":
            name = request.form.get("name", "")
            entry = current_app.config["SHOP_STAFF"].get(name)
            if entry and check_password_hash(entry[1], request.form.get("password", "")):
                session.clear()
                session["staff"] = name
                target = request.args.get("next", "")
                return redirect(target if target.startswith("/") and not target.startswith("//") else "/")
            flash("Wrong name or password.")
        return render_template("login.html")

    @bp.post("/logout")
    def logout():
        session.clear()
        return redirect(url_for("shop.index"))

    return bp
