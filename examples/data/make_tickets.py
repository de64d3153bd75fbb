"""Generate examples/data/support-tickets.jsonl: customer-support messages in six categories, for the quickstart.

Each line is one message and the team it belongs to, 300 per category, shuffled:

    {"text": "Hi, where is my order #482913? It was supposed to arrive last week. Thanks.", "label": "shipping"}

The categories are billing, shipping, account_access, technical_issue, feature_request and returns. A message
combines independent choices: an opening (or none), one of 20-22 requests of its category with its slots filled
(order numbers, products, amounts, dates, devices, couriers, error messages), maybe a detail sentence of the
category, maybe a neutral aside, and a closing (or none); 15% are typed casually, in lower case. Messages
stay within MAX_WORDS (the aside goes first, then the detail), so training and evaluation stay fast on a CPU.
Every category has requests in another category's words, so the task is not keyword matching: a refund for a
returned item (returns) beside a refund of an overcharge (billing), a crash at checkout (technical_issue) beside
a declined card (billing), a password rejected with an error (account_access) beside a crash after signing in
(technical_issue), delivery time slots (feature_request) beside a late delivery (shipping).

No two messages are near duplicates: a candidate sharing word 3-grams with a kept message at a Jaccard
similarity of MAX_SIMILARITY or more is drawn again (rentune's leak check between splits flags 0.7 and above).
Standard library only and one fixed seed: the output is byte-identical on every run. Regenerate with:

    python examples/data/make_tickets.py
"""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

SEED = 4242
PER_CATEGORY = 300
MAX_WORDS = 24
MAX_SIMILARITY = 0.5
OUTPUT = Path(__file__).resolve().parent / "support-tickets.jsonl"

# fmt: off
SLOTS = {
    "product": ["wireless earbuds", "running shoes", "coffee grinder", "desk lamp", "rain jacket", "yoga mat",
                "phone case", "blender", "backpack", "smartwatch", "winter boots", "bed sheets", "air fryer",
                "gaming mouse", "office chair", "kettle", "denim jacket", "baby monitor", "tent", "standing desk",
                "hair dryer", "bike helmet", "wool sweater", "toaster", "USB-C hub", "sunglasses"],
    "device": ["iPhone 12", "iPhone 15", "Pixel 7", "Samsung Galaxy S22", "iPad", "Android tablet", "MacBook",
               "Windows laptop", "Chromebook", "old Motorola phone"],
    "browser": ["Chrome", "Firefox", "Safari", "Edge", "Opera"],
    "carrier": ["DHL", "UPS", "FedEx", "DPD", "Royal Mail", "USPS", "GLS", "Evri", "PostNL"],
    "city": ["Leeds", "Bristol", "Lyon", "Hamburg", "Porto", "Dublin", "Austin", "Toronto", "Utrecht", "Glasgow",
             "Denver", "Krakow", "Seville", "Cork"],
    "country": ["Norway", "Canada", "Switzerland", "Australia", "Iceland", "Japan", "Mexico", "Ireland"],
    "day": ["Friday", "the weekend", "Monday", "my birthday", "the 14th", "Christmas", "next Wednesday"],
    "when": ["yesterday", "last week", "on Monday", "three days ago", "on the 2nd", "two weeks ago", "this morning",
             "last Thursday", "on the 20th", "ten days ago"],
    "month": ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"],
    "error": ['"Error 500"', '"something went wrong"', '"unexpected error, try again later"', "a blank white page",
              '"Error code E-4012"', '"503 Service Unavailable"', '"request timed out"', '"null reference"'],
    "feature": ["a dark mode", "a shareable wishlist", "Apple Pay at checkout", "delivery time slots",
                "an order export to CSV", "a size guide on every product page", "saved searches",
                "a Spanish version of the site", "gift wrapping", "a price drop alert",
                "a family account with separate profiles", "keyboard shortcuts", "a reorder button"],
    "payment": ["PayPal", "Apple Pay", "Google Pay", "Klarna", "bank transfer", "gift cards and a card together"],
    "relative": ["mum", "dad", "sister", "brother", "partner", "son", "daughter", "best friend", "grandmother"],
    "name": ["Sam", "Priya", "Tom", "Aisha", "Lukas", "Mei", "Carlos", "Fatima", "Jonas", "Olivia", "Kenji", "Grace",
             "Omar", "Elena", "Ben", "Zofia", "Ravi", "Chloe", "Diego", "Hannah"],
}

REQUESTS = {
    "billing": [
        "I was charged {amount} twice for order {order}. Please remove the duplicate charge.",
        "Why is my {month} invoice {amount} when last month it was {amount2}? I didn't change my plan.",
        "My card keeps getting declined at checkout although my bank says the payment is fine.",
        "I cancelled my subscription {when} but you still took {amount} from my account.",
        "Could you send me a VAT invoice for order {order}? I need it for my expenses.",
        "You took money twice for the same {product}. Can I have the second {amount} back?",
        "The trial was supposed to be free, yet {amount} left my account {when}.",
        "My {relative} and I both paid for order {order}. Could one of us get the money back?",
        "I bought the {product} for {amount}, but it was {amount2} in the app at the same time. Can you match it?",
        "The discount code was accepted but the {amount} discount is not on my bill.",
        "There is {amount} from you on my statement that I don't recognise.",
        "I'm paying for the premium plan but I only ever signed up for the basic one.",
        "How do I change the credit card you charge every month? The old one expires soon.",
        "You charged me {amount} for delivery although my order {order} was over the free shipping limit.",
        "The price of my plan went up from {amount2} to {amount} without any notice. Why?",
        "I paid by bank transfer {when} but invoice {order} still says unpaid.",
        "Please refund the {amount} you overcharged me on my last bill.",
        "The app froze while paying and I was charged twice, {amount} each time. I only want one of them.",
        "My gift card balance wasn't applied and I paid the full {amount} with my card.",
        "My annual renewal took {amount} but your pricing page says {amount2}.",
        "I was charged {amount} for order {order} although I cancelled it before it shipped.",
        "The app says my subscription is free, but my card was charged {amount} {when}.",
    ],
    "shipping": [
        "Where is my order {order}? It was supposed to arrive {when}.",
        "Tracking for {order} hasn't moved in {n} days, it's stuck at the {carrier} depot in {city}.",
        "{carrier} says my parcel was delivered {when} but there is nothing at my door.",
        "Can I change the delivery address for order {order}? I'm staying in {city} now.",
        "My {product} still hasn't been dispatched, it's been {n} days since I ordered.",
        "Do you deliver to {country}, and how long does it usually take?",
        "The courier left my package with a neighbour I don't know. How do I find it?",
        "Only half of my order arrived, the {product} was not in the box.",
        "Can order {order} still be upgraded to express? I need the {product} by {day}.",
        "The tracking page for {order} only says label created, nothing since {when}.",
        "I wasn't home when {carrier} came {when}. How do I rearrange the delivery?",
        "Could I collect my {product} from a parcel locker instead of home delivery?",
        "My order {order} went to my old address in {city}. Can you redirect it?",
        "I paid for next-day delivery and the {product} is now {n} days late.",
        "The delivery date keeps moving, first it was {day} and now it says next week.",
        "The {carrier} tracking number you sent for my {product} isn't recognised on their site.",
        "Which courier is bringing order {order}? I want to give them a safe place.",
        "The parcel with my {product} says returned to sender, but I never asked for that.",
        "Is there any way to get my {product} before {day}? It's a present for my {relative}.",
        "My order shows as shipped {when} but the courier has no record of it.",
    ],
    "account_access": [
        "I can't log in, it says my password is wrong even though I reset it {when}.",
        "The verification code never arrives by text, so I'm stuck on the sign-in screen.",
        "My account has been locked after too many attempts. How do I unlock it?",
        "I lost my phone and can't get the two-factor code any more, so I can't get into my account.",
        "The password reset email never comes, and I've checked the spam folder.",
        "Someone changed my password and email, I think my account was hacked.",
        "Every time I sign in on my {device} it says session expired and sends me back to the login page.",
        "It says invalid credentials on {browser}, but the same password works in the app.",
        "I registered with Google, but now the Google sign-in says there is no account.",
        "I no longer have access to the email I signed up with. How can I recover my account?",
        "The reset link says it has expired even when I click it straight away.",
        "My business account was deactivated and I can't log in to download the invoices.",
        "Sign-in asks for a code sent to my old phone number, which I don't have any more.",
        "After the update the app keeps asking me to log in again and my password won't work.",
        "I want to see where my {product} is, but I can't log in to check my orders.",
        "I need to update my card details but I'm locked out of my account.",
        "I can't get into my account to start a return for the {product}.",
        "The app shows {error} every time I enter my password, so I can't sign in.",
        "The activation email for my new account never arrived, so I can't use it yet.",
        "Face ID stopped working in your app on my {device} and the backup code is rejected.",
        "My account was closed for suspicious activity. Can you reopen it? Nothing was wrong.",
        "I opened a second account by mistake and now I can't get back into the first one with all my orders.",
    ],
    "technical_issue": [
        "The app crashes as soon as I open it on my {device}.",
        "When I click Pay the checkout page shows {error} and nothing happens.",
        "Product pictures don't load on {browser}, I just see grey boxes.",
        "The search finds nothing, not even the {product} I know you sell.",
        "The website is extremely slow today, every page takes a minute to load.",
        "Since the last update the app freezes on the home screen on my {device}.",
        "I get {error} when I try to upload a photo for my review.",
        "The add to basket button does nothing in {browser}.",
        "Push notifications stopped working on my {device} after the update.",
        "Downloading an invoice as PDF gives {error} in {browser}.",
        "The app says no internet connection although everything else on my {device} works.",
        "In dark mode the text on the settings page is invisible.",
        "My order history page is stuck on a loading spinner forever.",
        "The map on the tracking page doesn't load on my {device}, the rest of the site does.",
        "The app closes by itself whenever I tap on my basket.",
        "After I enter my card details the screen goes white and the page never finishes.",
        "I'm logged in fine, but then the site crashes with {error} when I open my account page.",
        "The filter for size and colour resets every time I scroll on {browser}.",
        "Videos on the product pages won't play on my {device}, only a black box.",
        "The form to contact you throws {error} when I press send.",
    ],
    "feature_request": [
        "It would be great if I could pay with {payment}.",
        "Please consider adding {feature} to the app.",
        "Could you let customers choose a delivery time slot? I'm never home in the mornings.",
        "I'd love a way to save more than one delivery address.",
        "Any plans for {feature}? I would use it all the time.",
        "Suggestion: let me return items at a parcel shop without printing a label.",
        "Could you offer login with an authenticator app instead of only text messages?",
        "It would help if the site remembered my filters between visits.",
        "Would you think about {feature}? Other shops have it already.",
        "Please make invoices downloadable as a spreadsheet for my accountant.",
        "A size guide on the product pages would save a lot of returns, just an idea.",
        "Please add an option to get an email when the {product} is back in stock.",
        "My idea for the shop: a loyalty scheme with points for every order.",
        "It would be nice to combine orders from the same day into one parcel.",
        "I'd like to be able to pause my subscription instead of cancelling it.",
        "Could the app show the tracking map for my {product} live? That would be a nice feature.",
        "Feature idea: {feature}. I think many customers would like it.",
        "Can you add a way to split the payment between two cards? It's a request, not a problem.",
        "I wish the app had a widget for my {device} showing my next delivery.",
        "Would love to see {feature} in a future version.",
    ],
    "returns": [
        "I want to return the {product} from order {order}, it doesn't fit.",
        "How do I get a return label for the {product}?",
        "I sent the {product} back {when} and still haven't had my refund.",
        "Can I exchange the {product} for a different size?",
        "The {product} arrived broken, I'd like to send it back for a replacement.",
        "You received my return {when} but only refunded {amount2} instead of {amount}.",
        "Do I have to pay for the return postage if the {product} is faulty?",
        "This is not the {product} I ordered. How do I send it back?",
        "I dropped my return off at the {carrier} shop {when}. How long until I get the money?",
        "Can I return just the {product} from order {order} and keep the rest?",
        "The {product} stopped working after a week, can I return it under warranty?",
        "I'd rather have store credit than a refund for the {product} I'm returning.",
        "Where do I send back a gift? I got the {product} from my {relative} with no receipt.",
        "The refund for my returned {product} went to a card I no longer have.",
        "My return for order {order} was rejected, but the {product} was unused and in its box.",
        "The return portal won't accept order {order}. Is the {product} not returnable?",
        "I returned the {product} in the original packaging, when will the {amount} be refunded?",
        "The courier never came to collect the return parcel with my {product}.",
        "The {amount} refund for the {product} I sent back still isn't on my card statement.",
        "The return label prints as a blank page. Can you email it so I can send the {product} back?",
        "Tracking says my returned {product} reached your warehouse {when}. When will you process it?",
        "I ordered two sizes of the {product} to try on. How do I send one of them back?",
    ],
}

DETAILS = {
    "billing": ["My account email is {email}.", "The charge appeared {when}.", "I have the bank statement here.",
                "The last four digits of the card are {digits}.", "It's on invoice {order}."],
    "shipping": ["The tracking number is {tracking}.", "I ordered it {when}.", "I've waited long enough.",
                 "I was home all day waiting.", "It's a gift so the date matters."],
    "account_access": ["My email is {email}.", "I've tried {browser} and the app.", "I've had this account for years.",
                       "I tried {n} times already.", "I haven't changed anything on my side."],
    "technical_issue": ["I'm using {browser} on my {device}.", "I've cleared the cache and reinstalled.",
                        "It started {when}.", "I can send a screenshot.", "It happens every single time."],
    "feature_request": ["Just a suggestion.", "Thanks for listening to customers.", "Keep up the good work.",
                        "I'm sure I'm not the only one.", "It would make my life easier."],
    "returns": ["The order number is {order}.", "It's still unused.", "I still have the box and the receipt.",
                "I bought it {when}.", "The tags are still on."],
}
OPENINGS = ["", "", "", "Hi,", "Hello,", "Hi team,", "Good morning,", "Hey,", "Dear support,", "Quick question.",
            "Hi, {name} here.", "Hello again.", "Sorry to bother you.", "Urgent:", "Hi there,", "Help please."]
ASIDES = ["", "", "", "", "", "", "", "I've been a customer for years.", "I tried the chat but nobody answered.",
          "This is the second time I'm writing about this.", "I'm away until {day}, so a quick answer would help.",
          "I already looked through your help pages.", "I love the shop otherwise.",
          "I'm writing from my {relative}'s phone."]
CLOSINGS = ["", "", "", "Thanks.", "Thanks in advance!", "Please help.", "Cheers, {name}", "Regards, {name}",
            "Looking forward to your reply.", "Any help appreciated.", "This is really frustrating.",
            "Can someone get back to me today?", "Thank you, {name}", "Many thanks."]
# fmt: on


def draw_slots(rng: random.Random) -> dict[str, str]:
    """One value for every slot, shared by all the parts of a message (one name, one order number)."""
    currency = rng.choice(["$", "£", "€"])
    values = {name: rng.choice(choices) for name, choices in SLOTS.items()}
    values.update(
        order=rng.choice(["#{}", "{}", "no. {}", "A-{}"]).format(rng.randint(100000, 999999)),
        amount=f"{currency}{rng.randint(5, 240)}.{rng.choice(['00', '99', '49', '50', '95'])}",
        amount2=f"{currency}{rng.randint(5, 240)}.{rng.choice(['00', '99', '49'])}",
        n=str(rng.randint(3, 12)),
        tracking=f"{rng.choice(['JD', 'CZ', '1Z', 'LX'])}{rng.randint(10**9, 10**10 - 1)}",
        digits=str(rng.randint(1000, 9999)),
        email=f"{values['name'].lower()}.{rng.randint(10, 99)}@{rng.choice(['gmail.com', 'outlook.com', 'mail.de'])}",
    )
    return values


def message(rng: random.Random, category: str) -> str:
    """One message: opening, request, detail, aside and closing, each optional except the request."""
    slots = draw_slots(rng)
    opening = rng.choice(OPENINGS).format(**slots)
    request = rng.choice(REQUESTS[category])
    if opening.endswith(",") and not request.startswith(("{", "I ", "I'")):
        request = request[0].lower() + request[1:]  # "Hi, where is ..."
    detail = rng.choice(DETAILS[category]).format(**slots) if rng.random() < 0.45 else ""
    aside, closing = rng.choice(ASIDES).format(**slots), rng.choice(CLOSINGS).format(**slots)
    parts = [opening, request.format(**slots), detail, aside, closing]
    for optional in (3, 2):  # over MAX_WORDS: without the aside, then without the detail
        if len(" ".join(parts).split()) > MAX_WORDS:
            parts[optional] = ""
    text = " ".join(part for part in parts if part)
    if rng.random() < 0.15:  # a casual message typed on a phone
        text = text.lower().replace("'", "").rstrip(".!")
    return text


def shingles(text: str) -> set[str]:
    """Word 3-grams after casefolding and stripping punctuation at word edges, as rentune's leak check."""
    words = [w.strip(".,:;!?\"'()") for w in text.casefold().split()]
    words = [w for w in words if w]
    return {" ".join(words[i : i + 3]) for i in range(len(words) - 2)} or set(words)


def make_rows() -> list[dict]:
    rng = random.Random(SEED)
    rows: list[dict] = []
    sets: list[set[str]] = []
    by_gram: dict[str, list[int]] = collections.defaultdict(list)
    for category in REQUESTS:
        accepted = 0
        while accepted < PER_CATEGORY:
            text = message(rng, category)
            grams = shingles(text)
            shared = collections.Counter(i for gram in grams for i in by_gram[gram])
            if any(n / (len(grams) + len(sets[i]) - n) >= MAX_SIMILARITY for i, n in shared.items()):
                continue  # too close to a message already kept: draw another
            for gram in grams:
                by_gram[gram].append(len(sets))
            sets.append(grams)
            rows.append({"text": text, "label": category})
            accepted += 1
    rng.shuffle(rows)
    return rows


def main() -> None:
    rows = make_rows()
    with OUTPUT.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    words = [len(row["text"].split()) for row in rows]
    counts = collections.Counter(row["label"] for row in rows)
    print(
        f"wrote {OUTPUT.name}: {len(rows)} rows ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
        f"words per message {min(words)}-{max(words)}, mean {sum(words) / len(words):.0f}"
    )


if __name__ == "__main__":
    main()
