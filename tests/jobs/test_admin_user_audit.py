"""Users and groups changed in the Django admin are audited (source "admin"), like every other write:
created, changed (staff, superuser, active, groups, so the role) and deleted, one row each, with the
before and after of what changed, never a password or its hash."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.forms import BooleanField, ModelMultipleChoiceField, SplitDateTimeField
from django.test import Client
from django.utils import timezone

from jobs.models import AuditEvent

USERS = "/admin/auth/user/"
GROUPS = "/admin/auth/group/"
PASSWORD = "A-long-enough-pass-9"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def root(db) -> Client:
    """A superuser's admin session: who may edit users and groups in the Django admin."""
    user = get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def pat(make_user):
    return make_user("viewer", "pat")


def form_data(client: Client, url: str, **overrides) -> dict:
    """The POST body the admin form at ``url`` would send with its initial values, plus overrides
    (True/False tick or untick a checkbox)."""
    response = client.get(url)
    assert response.status_code == 200
    form = response.context["adminform"].form
    data: dict = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field, BooleanField):
            if value:
                data[name] = "on"
        elif isinstance(field, SplitDateTimeField):
            local = timezone.localtime(value) if value else None
            data[f"{name}_0"] = local.strftime("%Y-%m-%d") if local else ""
            data[f"{name}_1"] = local.strftime("%H:%M:%S") if local else ""
        elif isinstance(field, ModelMultipleChoiceField):
            data[name] = [str(v) for v in value or []]
        elif value is not None:
            data[name] = str(value)
    for name, value in overrides.items():
        if value is False:
            data.pop(name, None)
        elif value is True:
            data[name] = "on"
        else:
            data[name] = value
    data["_save"] = "Save"
    return data


def only_event(**filters) -> AuditEvent:
    events = list(AuditEvent.objects.filter(**filters))
    assert len(events) == 1, [(e.action, e.changes) for e in AuditEvent.objects.all()]
    return events[0]


def test_a_user_added_in_the_admin_is_audited_without_the_password(root):
    response = root.post(
        f"{USERS}add/",
        {
            "username": "newbie",
            "password1": PASSWORD,
            "password2": PASSWORD,
            "usable_password": "true",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    user = get_user_model().objects.get(username="newbie")
    event = only_event(action="user.create")
    assert (event.object_type, event.object_id, event.object_repr) == (
        "user",
        str(user.pk),
        "newbie",
    )
    assert (event.source, event.actor_name) == ("admin", "root")
    assert event.changes["password"] == [None, "(set)"]
    assert PASSWORD not in str(event.changes) and user.password not in str(event.changes)


def test_making_a_user_superuser_and_staff_and_adding_groups_is_audited(root, pat):
    operator = Group.objects.get_or_create(name="operator")[0]
    viewer = Group.objects.get(name="viewer")
    pat.is_staff = False
    pat.save()
    url = f"{USERS}{pat.pk}/change/"
    data = form_data(
        root, url, is_superuser=True, is_staff=True, groups=[str(viewer.pk), str(operator.pk)]
    )
    response = root.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    event = only_event(action="user.update")
    assert (event.object_type, event.object_id, event.object_repr) == ("user", str(pat.pk), "pat")
    assert (event.source, event.actor_name) == ("admin", "root")
    assert event.changes["is_superuser"] == [False, True]
    assert event.changes["is_staff"] == [False, True]
    assert event.changes["groups"] == [["viewer"], ["operator", "viewer"]]
    assert event.changes["role"] == ["viewer", "admin"]
    assert "password" not in event.changes


def test_removing_a_users_groups_is_audited_as_a_role_change(root, pat):
    url = f"{USERS}{pat.pk}/change/"
    response = root.post(url, form_data(root, url, groups=[]))
    assert response.status_code == 302
    event = only_event(action="user.update")
    assert event.changes == {"groups": [["viewer"], []], "role": ["viewer", None]}


def test_saving_a_user_unchanged_writes_no_audit_row(root, pat):
    url = f"{USERS}{pat.pk}/change/"
    assert root.post(url, form_data(root, url)).status_code == 302
    assert not AuditEvent.objects.filter(object_type="user").exists()


def test_a_password_changed_in_the_admin_is_audited_not_shown(root, pat):
    response = root.post(
        f"{USERS}{pat.pk}/password/",
        {"password1": PASSWORD, "password2": PASSWORD, "usable_password": "true"},
    )
    assert response.status_code == 302
    pat.refresh_from_db()
    event = only_event(action="user.update")
    assert event.changes == {"password": ["(set)", "(changed)"]}
    assert PASSWORD not in str(event.changes) and pat.password not in str(event.changes)


def test_deleting_users_in_the_admin_is_audited(root, pat, make_user):
    sam = make_user("operator", "sam")
    response = root.post(f"{USERS}{pat.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    event = only_event(action="user.delete")
    assert (event.object_id, event.object_repr, event.source) == (str(pat.pk), "pat", "admin")
    assert event.changes["role"] == ["viewer", None]
    # The changelist's bulk delete too, one row per user.
    response = root.post(
        USERS, {"action": "delete_selected", "_selected_action": [sam.pk], "post": "yes"}
    )
    assert response.status_code == 302
    assert not get_user_model().objects.filter(username="sam").exists()
    event = only_event(action="user.delete", object_repr="sam")
    assert event.changes["role"] == ["operator", None]


def test_groups_created_changed_and_deleted_in_the_admin_are_audited(root):
    perm = Permission.objects.get(codename="view_job")
    response = root.post(f"{GROUPS}add/", {"name": "auditors", "permissions": [perm.pk]})
    assert response.status_code == 302
    group = Group.objects.get(name="auditors")
    event = only_event(action="group.create")
    assert (event.object_type, event.object_id, event.object_repr) == (
        "group",
        str(group.pk),
        "auditors",
    )
    assert event.changes == {"name": [None, "auditors"], "permissions": [None, ["jobs.view_job"]]}

    url = f"{GROUPS}{group.pk}/change/"
    response = root.post(url, form_data(root, url, name="readers", permissions=[]))
    assert response.status_code == 302
    event = only_event(action="group.update")
    assert event.changes == {
        "name": ["auditors", "readers"],
        "permissions": [["jobs.view_job"], []],
    }

    response = root.post(f"{GROUPS}{group.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    event = only_event(action="group.delete")
    assert (event.object_id, event.object_repr, event.source) == (str(group.pk), "readers", "admin")
