"""The dashboard in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver, against a real coordinator process with real agent processes. Pages render, a running
job's page updates by itself as the job moves on, a training job's page draws its curves, and a site
cannot open another site's page. XCLP_SCREENSHOTS=DIR also saves the pages as PNG (docs/ has them)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from svc import ADMIN, ProcessCluster

from xclp.data import load_arrays
from xclp.splits import simulate_sites

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
    pytest.skip(f"no browser: {CHROMIUM} and {DRIVER} come from Debian's chromium and chromium-driver "
                "(.ci/run installs them)", allow_module_level=True)

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow
WAIT = 180  # seconds: generous, a loaded machine is slow, and nothing here is timed


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # the flags a closed network needs (no background fetches), and a fresh profile
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def cluster(tmp_path):
    X, y = load_arrays("digits", limit=300, seed=6)
    X = (X / 16.0).astype(np.float32)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=6)
    sites = {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s], "y_true": ds.y_true[ds.site == s]}
             for s in ds.sites}
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coord.db'}", sites)
    try:
        yield c, ds.sites
    finally:
        c.close()


def wait(driver, what, pred):
    # The pages re-render their parts (and the cancel button reloads the page): an element found a moment
    # ago may be gone when its text is read. That is a reason to look again, not a failure.
    return WebDriverWait(driver, WAIT, poll_frequency=0.2,
                         ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: pred(d), message=what)


def text(driver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def log_in(driver, url: str, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{url}/ui")
    wait(driver, "the login page", lambda d: d.current_url.endswith("/ui/login"))
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login").click()
    wait(driver, "the jobs page", lambda d: d.current_url.endswith("/ui") and d.find_elements(By.ID, "jobs"))


def shot(driver, name: str) -> None:
    folder = os.environ.get("XCLP_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


def test_pages_render_a_running_job_updates_and_a_site_sees_only_its_own(browser, cluster):
    c, sites = cluster
    a, b, s3 = sites
    # a wrong token: the login page again, with the reason
    browser.get(f"{c.url}/ui/login")
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    browser.find_element(By.ID, "login").click()
    wait(browser, "the login error", lambda d: "unknown token" in text(d, "#error"))

    job = c.admin.submit_job(kind="predict", sites=sites, crypto="ot", bits=128, k=6, classes=10)
    log_in(browser, c.url, ADMIN)
    wait(browser, "the job in the list", lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"]'))
    # (the list redraws itself every few seconds: a link found an instant before may be gone by the click)
    wait(browser, "a click on the job's link", lambda d: d.find_element(By.LINK_TEXT, job).click() or True)
    wait(browser, "the job page in setup", lambda d: text(d, "#phase") == "setup" and text(d, "#status") == "running")
    assert ADMIN not in browser.current_url
    for s in sites:  # the sites come: the open page follows the job to its end without a reload
        c.start_agent(s)
    wait(browser, "the page to show the job done",
         lambda d: text(d, "#status") == "done"
         and len(d.find_elements(By.CSS_SELECTOR, '.timeline .phase[data-state="done"]')) == 5)
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1  # never reloaded
    shot(browser, "dashboard-job.png")

    # FedAvg+XCLP: the curves of accuracy and pseudo-label accuracy; DP-FedAvg: the ledger's ε (under DP
    # the sites send no statistics in the clear, so that job has no curves to draw)
    train = c.admin.submit_train(algorithm="fedavg-xclp", sites=sites, classes=10, crypto="plaintext", rounds=3,
                                 sites_per_round=3, local_epochs=1, lr=0.1, seed=1)
    private = c.admin.submit_train(algorithm="fedavg", sites=sites, classes=10, rounds=2, sites_per_round=3,
                                   local_epochs=1, seed=1, clip=1.0, dp_epsilon=50.0)
    browser.get(f"{c.url}/ui/jobs/{train}")
    wait(browser, "three rounds drawn",
         lambda d: text(d, "#status") == "done" and len(d.find_elements(By.CSS_SELECTOR, "#curves polyline")) == 2)
    assert browser.find_element(By.ID, "privacy").get_attribute("hidden") is not None  # no noise, no ε
    # the accuracy axis holds accuracies only: the sites left out are a column of the rounds table
    assert not browser.find_elements(By.CSS_SELECTOR, "#curves svg rect")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#rounds tr[data-round]")) == 3
    assert all(e.get_attribute("data-left-out") == "0" for e in browser.find_elements(By.CSS_SELECTOR, "#rounds td[data-left-out]"))
    # the sites' files carry y_true: the legend says the accuracy is on points the model did not train on
    assert "accuracy on unlabelled points (truth column)" in text(browser, "#curves .legend")
    shot(browser, "dashboard-training.png")

    # the jobs list: the training job's three round jobs folded under it; the filters unfold and filter
    browser.get(f"{c.url}/ui")
    wait(browser, "the training job's row with its rounds counted",
         lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job="{train}"] td[data-round-jobs="3"]'))
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-parent="{train}"]')
    browser.find_element(By.CSS_SELECTOR, '#job-filters input[name="unfold"]').click()
    wait(browser, "the round jobs on rows of their own",
         lambda d: len(d.find_elements(By.CSS_SELECTOR, f'tr[data-parent="{train}"]')) == 3)
    assert "unfold=1" in browser.current_url  # (a reload or a link keeps the filters)
    Select(browser.find_element(By.CSS_SELECTOR, '#job-filters select[name="kind"]')).select_by_value("train")
    wait(browser, "the training jobs only", lambda d: {e.get_attribute("data-job") for e in d.find_elements(
        By.CSS_SELECTOR, "#jobs tr[data-job]")} == {train, private})
    browser.get(f"{c.url}/ui/jobs/{private}")
    wait(browser, "the ledger's ε", lambda d: text(d, "#status") == "done" and "ε = " in text(d, "#epsilon"))
    browser.get(f"{c.url}/ui")
    wait(browser, "both jobs listed", lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-job]")) >= 2)
    wait(browser, "every site's last contact",
         lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-site]")) == 3 and "never" not in text(d, "#sites"))
    shot(browser, "dashboard-jobs.png")

    # a failed job: a sentence (no Python dict), and a bar that shows what was done, not a full one
    c.kill_agent(s3)
    failed = c.admin.submit_job(kind="predict", sites=[a, s3], crypto="ot", bits=128, k=6, classes=10)
    browser.get(f"{c.url}/ui/jobs/{failed}")
    c.wait(failed, lambda st: (a, "announce") in c.received(failed), what="a's announce")
    c.expire(failed)  # s3 never announces: dropped in setup, fewer than two sites left
    wait(browser, "the failed job", lambda d: text(d, "#status") == "failed" and text(d, "#failure"))
    assert text(browser, "#failure") == f"Fewer than two sites left after setup (dropped: {s3} (in setup))."
    bar = browser.find_element(By.ID, "progress-bar")
    assert bar.get_attribute("data-state") == "failed"
    assert bar.size["width"] < browser.find_element(By.CSS_SELECTOR, ".progress").size["width"]

    # a site: its own jobs only; another site's page and a job without it answer 403
    theirs = c.admin.submit_job(kind="predict", sites=[b, s3], crypto="ot", bits=128, classes=10)
    log_in(browser, c.url, c.tokens[a])
    wait(browser, "the site's jobs", lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"]'))
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{theirs}"]')
    assert [e.get_attribute("data-site") for e in browser.find_elements(By.CSS_SELECTOR, "tr[data-site]")] == [a]
    browser.get(f"{c.url}/ui/jobs/{theirs}")
    wait(browser, "403 on another site's job", lambda d: text(d, "#status") == "403")
    browser.get(f"{c.url}/ui/sites/{b}")
    wait(browser, "403 on another site's page", lambda d: text(d, "#status") == "403")
    browser.get(f"{c.url}/ui/sites/{a}")
    wait(browser, "its own page", lambda d: text(d, "#site-name") == a)


def test_a_revoked_site_is_marked_its_refusal_shows_and_the_operator_cancels_a_job(browser, cluster):
    c, sites = cluster
    a, b, s3 = sites
    job = c.admin.submit_job(kind="predict", sites=sites, crypto="ot", bits=128, k=6, classes=10)
    c.admin.revoke_site(s3)  # before any agent came: the job drops it at once, by a refusal on its behalf
    for s in (a, b):
        c.start_agent(s)
    log_in(browser, c.url, ADMIN)
    browser.get(f"{c.url}/ui/jobs/{job}")
    wait(browser, "the job done without the revoked site", lambda d: text(d, "#status") == "done")
    assert text(browser, "#refused").startswith(f"{s3} refused: revoked by the operator at ")
    marked = browser.find_elements(By.CSS_SELECTOR, '#job-sites .badge[data-status="revoked"]')
    assert [e.get_attribute("data-site") for e in marked] == [s3] and marked[0].text == "revoked"
    browser.get(f"{c.url}/ui")
    wait(browser, "the sites listed", lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-site]")) == 3)
    rows = {e.get_attribute("data-site"): e for e in browser.find_elements(By.CSS_SELECTOR, "tr[data-site]")}
    assert rows[s3].get_attribute("data-revoked") == "1" and "revoked" in rows[s3].text
    assert rows[a].get_attribute("data-revoked") == "0" and "active" in rows[a].text
    in_list = browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"] .badge[data-status="revoked"]')
    assert [e.get_attribute("data-site") for e in in_list] == [s3]
    shot(browser, "dashboard-revoked.png")
    browser.get(f"{c.url}/ui/sites/{s3}")
    wait(browser, "the revoked site's page", lambda d: text(d, "#site-name") == s3)
    assert text(browser, "#revoked") == "revoked" and "revoked by the operator at" in text(browser, "#revoked-at")

    # the operator cancels a job from its page: it fails at once, saying so, and the button goes
    c.kill_agent(b)
    stuck = c.admin.submit_job(kind="predict", sites=[a, b], crypto="ot", bits=128, k=6, classes=10)
    browser.get(f"{c.url}/ui/jobs/{stuck}")
    wait(browser, "the running job's cancel button", lambda d: d.find_element(By.ID, "cancel").is_displayed())
    browser.find_element(By.ID, "cancel").click()
    wait(browser, "the cancelled job", lambda d: text(d, "#status") == "cancelled")
    assert text(browser, "#failure") == "Cancelled by the operator."
    assert not browser.find_element(By.ID, "cancel").is_displayed()
