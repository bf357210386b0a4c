"""Site identity keys (crypto/identity.py): signatures over per-job keys, pins kept on disk, and the
refusals a swapped, stripped or re-keyed site meets."""

import json
import os

import pytest

from crypto.errors import IntegrityError
from crypto.identity import Identity, Pins, check_keys, fingerprint, key_digest
from crypto.keys import SiteKeyPair


def test_keys_signed_by_pinned_identities_pass_and_every_swap_is_caught(tmp_path):
    ids = {s: Identity.generate() for s in "abc"}
    keys = {s: SiteKeyPair.generate().public_bytes() for s in "abc"}
    signed = {s: {"identity": ids[s].public.hex(), "signature": ids[s].sign(key_digest("p", "j", s, keys[s])).hex()}
              for s in "abc"}
    pins = Pins(tmp_path / "known.json", trust_on_first_use=True)  # (a site with no membership, by its flag)
    assert check_keys(keys, signed, pins, me="a", job="j", purpose="p") == keys
    assert Pins(tmp_path / "known.json", trust_on_first_use=True).known == {s: ids[s].fingerprint for s in "bc"}  # kept, trusted on first use
    with pytest.raises(IntegrityError, match="does not verify"):  # c's key swapped, its signature kept
        check_keys({**keys, "c": SiteKeyPair.generate().public_bytes()}, signed, pins, me="a", job="j", purpose="p")
    with pytest.raises(IntegrityError, match="does not verify"):  # the same key signed for another job
        check_keys(keys, signed, pins, me="a", job="other", purpose="p")
    with pytest.raises(IntegrityError, match="no identity signature"):
        check_keys(keys, {s: v for s, v in signed.items() if s != "b"}, pins, me="a", job="j", purpose="p")
    mallory = Identity.generate()  # a swapped key signed by the swapper's own identity
    forged = {**signed, "c": {"identity": mallory.public.hex(),
                              "signature": mallory.sign(key_digest("p", "j", "c", keys["c"])).hex()}}
    with pytest.raises(IntegrityError, match="identity of site 'c' changed") as exc:
        check_keys(keys, forged, pins, me="a", job="j", purpose="p")
    assert ids["c"].fingerprint in str(exc.value) and mallory.fingerprint in str(exc.value)
    given = Pins(given={"b": ids["b"].fingerprint, "c": mallory.fingerprint})  # an operator's --pin wins
    with pytest.raises(IntegrityError, match="changed"):
        check_keys(keys, signed, given, me="a", job="j", purpose="p")


def test_an_identity_key_is_made_once_private_and_reloaded(tmp_path):
    path = tmp_path / "state" / "identity.key"
    me = Identity.load_or_create(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert Identity.load_or_create(path).public == me.public
    assert me.fingerprint == fingerprint(me.public) and me.fingerprint.startswith("SHA256:")
    assert "PRIVATE" not in repr(me)


def test_a_membership_admits_its_sites_only_and_trust_on_first_use_is_never_the_default(tmp_path):
    from crypto.identity import Membership

    ids = {s: Identity.generate() for s in "abcd"}
    path = tmp_path / "members.json"
    path.write_text(json.dumps({"sites": {s: ids[s].fingerprint for s in "abc"}}))
    pins = Pins(tmp_path / "known.json", membership=Membership.load(path), trust_on_first_use=True)
    assert pins.refusal(["a", "b", "c"], "a") is None
    why = pins.refusal(["a", "b", "c", "d"], "a")
    assert "'d'" in why and "did not admit" in why  # the Sybil named, before anything is sent
    with pytest.raises(IntegrityError, match="'d' is not a member"):  # ... and its key refused, flag or not
        pins.check("d", ids["d"].public)
    assert pins.check("b", ids["b"].public)
    with pytest.raises(IntegrityError, match="changed"):
        pins.check("c", ids["d"].public)
    bare = Pins(tmp_path / "other.json")  # no membership and no flag: no peer at all
    assert "no membership" in bare.refusal(["a", "b"], "a")
    with pytest.raises(IntegrityError, match="does not trust peers on first use"):
        bare.check("b", ids["b"].public)
    pinned = Pins(given={"b": ids["b"].fingerprint}, trust_on_first_use=True)  # pins are a membership too
    assert "'c'" in pinned.refusal(["a", "b", "c"], "a")
    with pytest.raises(Exception, match="contradicts"):
        Membership.load(path, {"a": ids["d"].fingerprint})
