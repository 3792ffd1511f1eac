"""Debian's headless Chromium, driven through chromedriver like an operator at a desk.

The browser and driver are the system's (``apt-get install chromium chromium-driver``),
named by absolute path so Selenium Manager never runs: it would otherwise look for, and
download, a browser and driver of its own over the network.
"""

from __future__ import annotations

import os
from pathlib import Path

try:  # a dev dependency; without it the tests skip (or fail in CI), collection still works
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:  # pragma: no cover
    webdriver = None

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_SECONDS = 15

# Everything Chromium would otherwise fetch or phone home for is switched off: the tests
# need only the live server on localhost.
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # we may run as root in CI containers
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--no-pings",
    "--disable-features=AutofillServerCommunication,PasswordLeakDetection,"
    "OptimizationHints,Translate,MediaRouter,SignInProfileCreation",
    "--window-size=1280,1400",
    # The backstop: Debian's wrapper turns remote extensions on, and sign-in and update
    # checks still resolve Google hosts. Every name but the live server's fails locally.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)
PREFS = {
    "credentials_enable_service": False,
    "profile.password_manager_enabled": False,
    "profile.password_manager_leak_detection": False,
    "net.network_prediction_options": 2,  # no preconnects to the search engine
    # The desk follows the browser's language (LocaleMiddleware): English unless a test
    # switches, whatever the machine's locale.
    "intl.accept_languages": "en-US,en",
}


def missing() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    problems = [
        f"{path} is missing" for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)
    ]
    if webdriver is None:
        problems.append("the selenium package is not installed (pip install -e '.[dev]')")
    if not problems:
        return ""
    return (
        "Browser tests need Debian's Chromium and chromedriver: "
        + "; ".join(problems)
        + ". Install them with `apt-get install -y chromium chromium-driver` (.ci/run does)."
    )


def xpath_literal(text: str) -> str:
    """``text`` as an XPath 1.0 string literal (which has no escape for quotes)."""
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "concat('" + "', \"'\", '".join(text.split("'")) + "')"


class Browser:
    """One Chromium session against the live server, with the verbs an operator uses.

    Every verb that submits or follows a link waits for the next page to load, so the
    assertions that follow read the page the operator would be looking at.
    """

    def __init__(self, base_url: str, profile: Path) -> None:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.add_experimental_option("prefs", PREFS)
        service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile) + ".log")
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(WAIT_SECONDS)
        self.base_url = base_url

    def quit(self) -> None:
        self.driver.quit()

    # -- reading the screen -----------------------------------------------------------

    @property
    def text(self) -> str:
        """The text the operator can see (hidden elements excluded)."""
        return self.driver.find_element(By.TAG_NAME, "body").text

    @property
    def title(self) -> str:
        return self.driver.find_element(By.TAG_NAME, "h1").text

    @property
    def path(self) -> str:
        return self.driver.current_url.removeprefix(self.base_url)

    def messages(self) -> list[str]:
        """The admin's message banners (success, warning, error)."""
        return [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, ".messagelist li")]

    def errors(self) -> list[str]:
        """Form errors shown next to fields or at the top of a form."""
        found = self.driver.find_elements(By.CSS_SELECTOR, ".errorlist li, p.errornote")
        return [e.text for e in found if e.is_displayed()]

    def shown(self, css: str) -> str:
        """The visible text of the first element matching ``css``."""
        return self.driver.find_element(By.CSS_SELECTOR, css).text

    def section(self, heading: str) -> str:
        """The visible text of the page section whose heading starts with ``heading``."""
        xpath = f"//section[h2[starts-with(normalize-space(), {xpath_literal(heading)})]]"
        return self.driver.find_element(By.XPATH, xpath).text

    def buttons(self) -> list[str]:
        found = self.driver.find_elements(By.CSS_SELECTOR, "input[type=submit], button")
        return [e.get_attribute("value") or e.text for e in found if e.is_displayed()]

    def stylesheets(self) -> list[str]:
        """Stylesheets that loaded (a missing one has no readable rules)."""
        return self.driver.execute_script(
            "return Array.from(document.styleSheets)"
            ".filter(s => s.href && s.cssRules.length > 0).map(s => s.href);"
        )

    def screenshot(self, path: Path) -> Path:
        assert self.driver.save_screenshot(str(path)), f"no screenshot written to {path}"
        return path

    # -- acting -------------------------------------------------------------------------

    def open(self, path: str) -> None:
        """Load ``path`` and wait until the page has finished loading."""
        self.driver.get(self.base_url + path)
        self._wait_until(
            lambda d: d.execute_script("return document.readyState === 'complete';"),
            f"the page {path} to finish loading",
        )

    def _wait_until(self, condition, what: str):
        """Wait for ``condition`` (a callable of the driver) and return its value.

        A busy machine slows the live server and Chromium alike, so the tests wait for
        what the operator would wait for, never for a fixed time. On a timeout the failure
        says what was awaited and which page the browser shows.
        """
        try:
            return WebDriverWait(
                self.driver, WAIT_SECONDS, ignored_exceptions=(WebDriverException,)
            ).until(condition)
        except TimeoutException:
            raise AssertionError(
                f"waited {WAIT_SECONDS} s for {what}; the browser shows {self.path!r}"
                f" ({self.driver.title!r})"
            ) from None

    def _field(self, name: str):
        fields = [
            e
            for e in self.driver.find_elements(By.NAME, name)
            if e.is_displayed() or e.get_attribute("type") == "file"
        ]
        assert len(fields) == 1, f"expected one visible field {name!r}, found {len(fields)}"
        return fields[0]

    def value(self, name: str) -> str:
        """What the field ``name`` currently holds."""
        return self._field(name).get_attribute("value")

    def fill(self, name: str, value: str) -> None:
        field = self._field(name)
        field.clear()
        field.send_keys(value)

    def choose(self, name: str, value: str) -> None:
        """Tick the radio button ``value`` of ``name``."""
        self.driver.find_element(
            By.CSS_SELECTOR, f"input[type=radio][name={name!r}][value={value!r}]"
        ).click()

    def select(self, name: str, label: str) -> None:
        Select(self._field(name)).select_by_visible_text(label)

    def attach(self, name: str, path: Path) -> None:
        """Pick a file in a file input, as the file dialog would."""
        self._field(name).send_keys(str(path))

    def press(self, label: str) -> None:
        """Click the submit button labelled ``label`` and wait for the next page."""
        text = xpath_literal(label)
        xpath = f"//input[@type='submit' and @value={text}] | //button[normalize-space()={text}]"

        def button(driver):
            found = driver.find_elements(By.XPATH, xpath)
            return found[0] if found else False

        self._and_wait(self._wait_until(button, f"a button labelled {label!r}").click)

    def follow(self, link: str) -> None:
        """Click the first visible link reading ``link`` and wait for the next page.

        Matched on the page's text, not the rendered one: the admin's stylesheet shows
        some links in capitals.
        """
        xpath = f"//a[normalize-space()={xpath_literal(link)}]"

        def visible_link(driver):
            shown = [a for a in driver.find_elements(By.XPATH, xpath) if a.is_displayed()]
            return shown[0] if shown else False

        self._and_wait(self._wait_until(visible_link, f"a visible link reading {link!r}").click)

    def _and_wait(self, act) -> None:
        # The old page is marked and the new one is waited for. Polling an old element for
        # staleness races chromedriver mid-navigation ("Node with given id does not belong
        # to the document"), so transient driver errors while the page swaps are ignored.
        self.driver.execute_script("document.documentElement.dataset.leaving = 'yes';")
        act()
        self._wait_until(
            lambda d: d.execute_script(
                "return document.readyState === 'complete'"
                " && document.documentElement.dataset.leaving === undefined;"
            ),
            "the next page to load",
        )

    def log_in(self, username: str, password: str, code: str | None = None) -> None:
        """Log in; a privileged user types a fixture recovery code unless ``code`` is given."""
        from tests.identity import fixture_code

        self.open("/admin/login/")
        self.fill("username", username)
        self.fill("password", password)
        self.fill("otp_token", fixture_code(username) if code is None else code)
        self.press("Log in")

    def log_out(self) -> None:
        self.press("Log out")
