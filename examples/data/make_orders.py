"""Generate examples/data/orders-chat.jsonl: a small structured-extraction dataset in chat format.

Each line is one conversation in OpenAI chat "messages" format plus the channel it came from:

    {"messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}],
     "channel": "email" | "web-form" | "chat"}

The user turn is a short order message (an email with greeting and signature, a terse web form, or a casual
chat line) and the assistant turn is the order as JSON with exactly the keys customer, product, quantity and
delivery_date, in that order. About 5% of the conversations are multi-turn: the first message leaves the
quantity out, the assistant asks for it, the user answers, and the last turn is the JSON. About 10% of the
messages give no delivery date (JSON null). Messages carry distractor numbers (order and ticket numbers,
phone numbers, prices, street numbers, an earlier order) so that the quantity has to be read from context.
Dates are absolute and in 2027; forms such as 05/03/2027 are only used when the day is above 12, so they
are never ambiguous.

Everything comes from the standard library and one fixed seed, so the output is byte-identical on every run.
Regenerate with:

    python examples/data/make_orders.py

It writes orders-chat.jsonl next to this file and then checks the rows it wrote (the JSON parses, has the
four keys in order, and the customer, product, quantity and date can be found in the user's text).
"""

from __future__ import annotations

import datetime
import json
import random
import re
import unicodedata
from pathlib import Path

SEED = 2027
N_ROWS = 480
N_MULTI_TURN = 24  # 5%
N_NO_DATE = 48  # 10%
CHANNELS = ["email", "web-form", "chat"]
YEAR = 2027
MAX_EMAIL_BODY_WORDS = 22  # longer email bodies get no opener, no subject line and a one-line signature

OUTPUT = Path(__file__).resolve().parent / "orders-chat.jsonl"

# Short on purpose: it is in every training row and every prompt (about 35 tokens for SmolLM2).
SYSTEM = (
    "Extract the order as JSON only: customer, product, quantity, delivery_date (YYYY-MM-DD or null). The year is 2027."
)

# --------------------------------------------------------------------------------------------------------
# Pools
# --------------------------------------------------------------------------------------------------------

# The pools and templates stay compact, several items to a line.
# fmt: off
# First and last names by culture; a customer gets both names from the same culture.
NAMES = {
    "english": (
        ["Oliver", "Charlotte", "Harry", "Amelia", "George", "Emily", "Jack", "Sophie", "Thomas", "Grace"],
        ["Smith", "Taylor", "Brown", "Wilson", "Evans", "Walker", "Wright", "Hughes", "Clarke", "Turner"],
    ),
    "irish-scottish": (
        ["Siobhan", "Declan", "Aoife", "Niamh", "Ciaran", "Eilidh", "Callum", "Fiona"],
        ["O'Brien", "Murphy", "MacLeod", "Byrne", "Gallagher", "Fraser", "Kennedy", "Doyle"],
    ),
    "spanish": (
        ["Lucía", "Mateo", "Sofía", "Javier", "Carmen", "Diego", "Isabel", "Alejandro", "Marta", "Pablo"],
        ["García", "Fernández", "López", "Martínez", "Sánchez", "Romero", "Navarro", "Torres"],
    ),
    "portuguese": (
        ["João", "Ana Clara", "Gabriel", "Beatriz", "Rafael", "Larissa", "Thiago", "Camila", "Felipe"],
        ["Silva", "Santos", "Oliveira", "Souza", "Pereira", "Costa", "Almeida", "Ribeiro"],
    ),
    "french": (
        ["Camille", "Louis", "Chloé", "Hugo", "Manon", "Julien", "Léa", "Antoine", "Élise", "Mathieu"],
        ["Martin", "Bernard", "Dubois", "Moreau", "Laurent", "Lefèvre", "Girard", "Fontaine"],
    ),
    "german": (
        ["Lukas", "Lena", "Felix", "Anna", "Jonas", "Marie", "Maximilian", "Katrin", "Tobias", "Julia"],
        ["Müller", "Schmidt", "Schneider", "Fischer", "Weber", "Becker", "Hoffmann", "Wagner"],
    ),
    "polish": (
        ["Jakub", "Zofia", "Kacper", "Maja", "Piotr", "Agnieszka", "Tomasz", "Katarzyna", "Michał", "Ewa"],
        ["Nowak", "Wójcik", "Kowalczyk", "Mazur", "Krawczyk", "Zając", "Król", "Wieczorek"],
    ),
    "turkish": (
        ["Emre", "Elif", "Mehmet", "Zeynep", "Burak", "Ayşe", "Can", "Defne"],
        ["Yılmaz", "Kaya", "Demir", "Şahin", "Çelik", "Aydın", "Öztürk", "Arslan"],
    ),
    "arabic": (
        ["Omar", "Layla", "Youssef", "Fatima", "Karim", "Nour", "Hassan", "Amira", "Tariq", "Salma"],
        ["Haddad", "Khalil", "Mansour", "Nasser", "Saleh", "Farouk", "Aziz", "Hamdan"],
    ),
    "nigerian": (
        ["Chinedu", "Ngozi", "Oluwaseun", "Funmilayo", "Emeka", "Adaeze", "Tunde", "Yetunde", "Amaka"],
        ["Okafor", "Adeyemi", "Eze", "Balogun", "Nwosu", "Okonkwo", "Adebayo", "Obi"],
    ),
    "kenyan": (
        ["Wanjiru", "Otieno", "Achieng", "Kamau", "Njeri", "Mwangi", "Akinyi", "Baraka"],
        ["Odhiambo", "Kariuki", "Mutua", "Wambui", "Ochieng", "Kiprop", "Chebet", "Njoroge"],
    ),
    "indian": (
        ["Priya", "Arjun", "Ananya", "Rohan", "Kavya", "Vikram", "Deepa", "Rahul", "Sneha", "Aditya"],
        ["Sharma", "Patel", "Iyer", "Reddy", "Nair", "Gupta", "Singh", "Menon"],
    ),
    "chinese": (
        ["Wei", "Li Na", "Jing", "Hao", "Mei", "Jun", "Xiaoling", "Zhiwei", "Yan", "Bo"],
        ["Wang", "Li", "Zhang", "Liu", "Chen", "Yang", "Huang", "Zhao"],
    ),
    "japanese": (
        ["Haruto", "Yui", "Sota", "Aoi", "Ren", "Hina", "Takeshi", "Yuki", "Kenji", "Sakura"],
        ["Sato", "Suzuki", "Takahashi", "Tanaka", "Watanabe", "Ito", "Nakamura", "Kobayashi"],
    ),
    "korean": (
        ["Min-jun", "Seo-yeon", "Ji-ho", "Ha-eun", "Jae-won", "Su-bin", "Hyun-woo", "Ye-jin"],
        ["Kim", "Park", "Choi", "Jung", "Kang", "Yoon", "Lim", "Han"],
    ),
    "vietnamese": (
        ["Minh", "Linh", "Huy", "Thao", "Duc", "Trang", "Quang", "Lan", "Tuan", "Hoa"],
        ["Nguyen", "Tran", "Le", "Pham", "Hoang", "Vu", "Dang", "Bui"],
    ),
}

# (product, container). A product without a container is counted as is ("3 desk lamps"); one with a
# container is counted in containers ("3 bags of espresso beans 1kg"). Every plural contains the product
# name verbatim, so the product can always be copied from the message.
PRODUCTS = [
    ("USB-C charger", None),
    ("wireless keyboard", None),
    ("ergonomic office chair", None),
    ("standing desk", None),
    ("desk lamp", None),
    ("27-inch monitor", None),
    ("laptop stand", None),
    ("noise-cancelling headset", None),
    ("webcam", None),
    ("HDMI cable", None),
    ("power strip", None),
    ("whiteboard", None),
    ("filing cabinet", None),
    ("printer toner cartridge", None),
    ("smart plug", None),
    ("smart light bulb", None),
    ("portable speaker", None),
    ("phone case", None),
    ("screen protector", None),
    ("extension cord", None),
    ("cordless drill", None),
    ("screwdriver set", None),
    ("tape measure", None),
    ("garden hose", None),
    ("flower pot", None),
    ("watering can", None),
    ("coffee mug", None),
    ("water bottle", None),
    ("kettle", None),
    ("toaster", None),
    ("blender", None),
    ("rice cooker", None),
    ("air fryer", None),
    ("cutting board", None),
    ("cast iron skillet", None),
    ("yoga mat", None),
    ("dumbbell set", None),
    ("bike helmet", None),
    ("camping tent", None),
    ("sleeping bag", None),
    ("hiking backpack", None),
    ("umbrella", None),
    ("cotton T-shirt", None),
    ("knitted beanie", None),
    ("rain jacket", None),
    ("baseball cap", None),
    ("bath towel", None),
    ("bed sheet set", None),
    ("scented candle", None),
    ("board game", None),
    ("jigsaw puzzle", None),
    ("spiral notebook", None),
    ("first aid kit", None),
    ("fire extinguisher", None),
    ("hi-vis vest", None),
    ("espresso beans 1kg", "bag"),
    ("loose-leaf black tea", "tin"),
    ("oat milk 1L", "carton"),
    ("sparkling water 500ml", "bottle"),
    ("olive oil 750ml", "bottle"),
    ("basmati rice 5kg", "sack"),
    ("honey 500g", "jar"),
    ("potting soil 20L", "bag"),
    ("printer paper A4", "ream"),
    ("gel pens", "box"),
    ("sticky notes", "pack"),
    ("AA batteries", "pack"),
    ("dishwasher tablets", "box"),
    ("laundry detergent 2L", "bottle"),
]

COMPANIES = [
    "Brightline Studio", "Harbourview Dental", "Cedar Street Café", "Nakamura Design", "Okafor & Sons",
    "Bluebell Nursery", "Northgate Physio", "Kestrel Logistics", "Maple Leaf Bakery", "Riverside Library",
    "Summit Climbing Gym", "Papaya Digital", "Lindenhof Hotel", "Greenfield Primary School", "Atlas Print Shop",
    "Copperpot Kitchen", "Orchard Vets", "Tidewater Yoga", "Quarry Lane Garage", "Saffron House Restaurant",
    "Hilltop Community Centre", "Pixel & Pine", "Juniper Co-working", "Old Mill Brewery",
]
ROLES = [
    "Office Manager", "Head Chef", "Procurement", "Operations Lead", "IT Support", "Owner", "Facilities",
    "Practice Manager", "Studio Coordinator", "Store Manager", "Head Teacher", "Events Team",
]
DEPARTMENTS = [
    "Facilities", "Marketing", "IT", "Kitchen", "Front of house", "Operations", "Finance", "HR", "Warehouse",
    "Design", "Customer service", "Research",
]
STREETS = [
    "Harbour Road", "Elm Street", "Station Lane", "Mill Road", "Kingsway", "Baker Avenue", "Church Street",
    "Queen's Parade", "Willow Close", "Market Square", "Canal Walk", "Orchard Drive", "Victoria Terrace",
    "Bridge Street", "Parkside", "High Street",
]
REASONS = [
    "for the new office", "for our café", "for the spring workshop", "for the school fair",
    "for our new starters", "for the warehouse team", "for a client event", "for the community centre",
    "for our pop-up shop", "for the reception area", "for the staff kitchen", "for my home office",
    "for our summer camp", "for the clinic waiting room", "for the guest rooms", "for a charity raffle",
    "for the gym floor", "for the photo studio", "for our volunteers", "for the design team",
    "as gifts for the team", "for the new branch", "for our holiday flat", "for the football club",
    "for the library corner", "for the night shift", "for the allotment", "for our cooking class",
]

GREETINGS = [
    "Hi,", "Hello,", "Dear team,", "Good morning,", "Hi there,", "Hello support,", "Dear Sir or Madam,",
    "Hey team,", "Good afternoon,", "To whom it may concern,", "Hi all,", "Greetings,", "Dear sales team,",
    "Hello again,",
]
SIGNOFFS = [
    "Thanks,", "Best regards,", "Kind regards,", "Many thanks,", "Cheers,", "Regards,", "Thank you,", "Best,",
    "Warm regards,", "All the best,", "Sincerely,", "Thanks in advance,", "With thanks,", "Speak soon,",
]
SUBJECTS = [
    "Order request", "New order", "Restock", "Purchase enquiry", "Supplies", "Order please", "Re: your catalogue",
    "Quick order", "Stock top-up",
]
# Opening sentences for emails; "" means none.
EMAIL_OPENERS = [
    "", "", "", "I hope this finds you well.", "Hope your week is going well.",
    "Thanks for the quick help last time.", "I found you through a friend's recommendation.",
    "We have been happy customers for a while now.", "Apologies for the short notice.",
    "Hope all is good on your end.", "I tried the website but the basket kept emptying.",
]
# Self-introductions that end "My name is X and I ..."
INTRO_TAILS = [
    "run a small bakery in town", "manage the front desk at {company}", "have ordered from you a few times before",
    "look after supplies for {company}", "coordinate events at {company}", "am setting up a new workspace",
    "handle purchasing for a small team", "volunteer at the local youth club",
]
EMAIL_EXTRAS = [
    "", "", "Please send the invoice to our accounts inbox.", "Leave the parcel at reception if nobody answers.",
    "Let me know if anything is out of stock.", "We can pay by bank transfer as usual.",
    "Could you confirm once it has shipped?", "Please use recyclable packaging if you can.",
    "A tracking link would be much appreciated.", "There is a loading bay at the back of the building.",
    "Please ring the bell marked Deliveries.", "Happy to pay for express shipping.",
    "Our door code is on the account notes.", "Call me if the courier has any trouble finding us.",
    "No need for a printed receipt.", "We would appreciate a discount for repeat business.",
]
WEB_COMMENTS = [
    "Please deliver to the side entrance.", "Invoice to the company address please.",
    "Ring before arriving, the gate is locked.", "Gift wrap not needed.", "Ship in one box if possible.",
    "Signature on delivery required.", "Please confirm by email.", "Leave with the neighbour if out.",
    "Second order this quarter, thanks for the fast service.", "Found the item via your newsletter.",
    "Happy with standard shipping.", "Please include spare packaging.", "We close at 5pm on weekdays.",
    "Card payment on the account.", "Use the lift, the stairs are being repainted.",
    "Needs to match the last batch.", "Delivery to the loading dock at the rear.",
    "No substitutes please.", "Please text when dispatched.", "Small office, limited storage space.",
    "Contact me on the number above with questions.", "Second floor, turn left out of the lift.",
    "Parking is available out front.", "Cardboard packaging preferred over plastic.",
]
CHAT_FILLERS = [
    "love the new range btw", "saw your post on insta", "a colleague recommended you", "hope you're having a good day",
    "first time ordering here", "you were super quick last time", "sorry for the late message",
    "typing this on my phone", "my old one finally gave up", "the reviews looked great",
    "we're expanding a bit", "just moved into a new place", "my sister swears by yours",
    "trying to sort this before the weekend", "my boss asked me to handle it", "quick question first",
    "thanks for the help earlier", "big fan of the shop", "been meaning to do this for ages",
    "saw it in your window display", "we ran out faster than expected", "happy friday",
    "the last batch went down well", "hope this is the right place to ask",
]
CLARIFYING_QUESTIONS = [
    "How many would you like?", "How many {many} do you need?", "Sure! What quantity should I put down?",
    "Happy to help. How many would you like to order?", "Could you tell me the quantity you need?",
    "Got it. How many should I add?", "Thanks! How many {many} shall I put on the order?",
]
QUANTITY_ANSWERS = [
    "{qty}, please.", "Let's say {qty}.", "{qty} should do it.", "We need {qty}.", "Make it {qty}.",
    "{qty} would be great, thanks.", "{qty} for now.", "Put me down for {qty}.",
]
NO_DATE_SENTENCES = [
    "No rush on the delivery.", "Whenever it suits you is fine.", "Delivery date is flexible.",
    "Any delivery day works for us.", "We are not in a hurry.", "Standard delivery is fine.",
    "Send it whenever it is ready.", "Timing is not critical.",
]
NO_DATE_FIELDS = ["not specified", "flexible", "-", "no preference", "any", "n/a", "whenever"]
NO_DATE_ANSWERS = ["No preference", "Not urgent", "Any time is fine", "Whenever", "Flexible"]
DATE_PREPOSITIONS = ["by", "by", "on", "no later than", "for", "to arrive by", "to be delivered on"]
DATE_SENTENCES = [
    "It needs to arrive by {date}.", "Please deliver on {date}.", "We need it delivered by {date}.",
    "Delivery on {date} would be ideal.", "Could it arrive no later than {date}?", "The deadline is {date}.",
    "Our event is on {date}, so please deliver by then.", "Please have it with us by {date}.",
    "We would like delivery for {date}.", "Ideally it gets here on {date}.",
]

MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
]
MONTH_ABBREVIATIONS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sept", "Oct", "Nov", "Dec"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]
TENS = {20: "twenty", 30: "thirty", 40: "forty", 50: "fifty"}

# --------------------------------------------------------------------------------------------------------
# Templates. Fields are filled by `fields_for`; see there for what each one holds.
# --------------------------------------------------------------------------------------------------------

# Email bodies; each goes between a greeting and a signature.
EMAIL_BODIES = [
    "I would like to place an order for {items}{when}. {distractor} {extra}",
    "Could you please send {items} to our office{when}? {distractor} {extra}",
    "We are running low on {many} {reason} and need {more}. {date_sentence} {distractor}",
    "My name is {name} and I {intro_tail}. I'd like to order {items}{when}. {extra}",
    "Please process the following order: {items}. {date_sentence} {distractor} {extra}",
    "I am writing on behalf of {company} to order {items} {reason}. {date_sentence} {distractor}",
    "Quick request from our side: we need {items} {reason}{when}. {distractor}",
    "Is it possible to order {items}? {date_sentence} {distractor} {extra}",
    "{previous} Could I get {items} this time{when}? {extra}",
    "We received your quote of {price} per unit for the {product}. Please go ahead with {amount}{when}. {distractor}",
    "Following up on {ref}: that one is sorted, thanks. Now we need {items} {reason}. {date_sentence}",
    "Our team has decided to go ahead with {items}. {date_sentence} The delivery address is {address}. {extra}",
    "I'm after {items} {reason}. {date_sentence} {distractor}",
    "Please add {items} to our account{when}. {distractor} The rest of the order can wait.",
]
# Whole chat messages.
CHAT_TEMPLATES = [
    "hey, {name} here. can i get {items}{when}? {chatter}",
    "hi! {chatter}. i need {items}{when}. {chat_distractor} thx, {name}",
    "{items} please{when} :) {chatter} - {name}",
    "hello, this is {name}. {filler}, want to order {items}. {date_sentence} {chat_distractor}",
    "quick one: {items}{when}. {chat_distractor} {chatter}. cheers, {name}",
    "yo, could you put me down for {items}? {date_sentence} {chatter}. {name}",
    "hiya, {name} again. same {product} as last time but {amount} this time, not {previous_quantity}. "
    "{date_sentence} {filler}",
    "{name}: need {items}{when} pls. {chatter}",
    "hi there, {filler}. i'd like {items}. {date_sentence} thanks! ({name})",
    "is it too late to order {items}? {date_sentence} i'm {name} btw, {chat_distractor} {filler}",
    "ok so {chatter}. anyway, {items} for me please{when}. {name}",
    "morning! {name} from {company}. we'd like {items}{when}. {chat_distractor} {filler}",
    "can you do {items}{when}? {chatter}. {chat_distractor} it's {name}",
]
# Whole web-form submissions.
WEB_FORM_TEMPLATES = [
    "Name: {name}\nEmail: {email}\nProduct: {product}\nQuantity: {qty_field}\nDelivery date: {date_field}\n"
    "Message: {comment}",
    "Full name: {name}\nItem: {product}\nQty: {qty_field}\nRequested delivery: {date_field}\nOrder ref: {ref}\n"
    "Notes: {comment}",
    "Customer: {name}\nPhone: {phone}\nAddress: {address}\nRequest: {Items}{when}. {comment}",
    "Subject: New order\nFrom: {name} <{email}>\nDetails: {Items}{when}. {comment}",
    "ORDER FORM\nContact name: {name}\nCompany: {company}\nProduct name: {product}\nAmount: {qty_field}\n"
    "Deliver by: {date_field}\nComments: {comment}",
    "Topic: Order\nYour name: {name}\nWhat would you like to order? {Items}\nWhen do you need it? {date_answer}\n"
    "Anything else? {comment}",
    "Enquiry type: Purchase\nName: {name}\nPhone: {phone}\nMessage: Hello, please send {items}{when}. {comment}",
    "Name: {name} | Product: {product} | Qty: {qty_field} | Needed by: {date_field} | Note: {comment}",
    "Customer name: {name}\nAccount no.: {account}\nItems: {qty_digits} x {product}\nPreferred date: {date_field}\n"
    "Unit price quoted: {price}\nComment: {comment}",
    "Request type: order\nRequester: {name}\nDepartment: {department}\nItem requested: {product}\n"
    "Number needed: {qty_field}\nDeadline: {date_field}\nJustification: Needed {reason}.",
    "Contact form\nName: {name}\nEmail: {email}\nOrder number (if any): {ref}\nYour message: I want {items}{when}. "
    "{comment}",
]

# Multi-turn openers: the first message names the product but not the quantity.
MULTI_TURN_TEMPLATES = {
    "email": [
        "I'd like to order some {many} {reason}{when}. What else do you need from me? {no_quantity_distractor}",
        "We want to restock {many} {reason}. {date_sentence} Please confirm once the order is in.",
        "Following up on {ref}, we would now like some {many}. {date_sentence}",
    ],
    "chat": [
        "hi, {name} here. want to grab some {many}{when}. {filler}",
        "hey! looking to order {many} {reason}. {date_sentence} - {name}",
        "{filler}. can i order some {many}{when}? it's {name}",
    ],
    "web-form": [
        "Name: {name}\nProduct: {product}\nQuantity:\nDelivery date: {date_field}\n"
        "Message: {comment} Not sure about the amount yet.",
        "Your name: {name}\nWhat would you like to order? Some {many}\nWhen do you need it? {date_answer}\n"
        "Anything else? {comment}",
        "Customer: {name}\nPhone: {phone}\nRequest: Please send some {many} {reason}{when}. Quantity to be confirmed.",
    ],
}

# fmt: on

# --------------------------------------------------------------------------------------------------------
# Rendering helpers
# --------------------------------------------------------------------------------------------------------


def number_words(n: int) -> str:
    """1..50 in words: 'three', 'twenty-one'."""
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens * 10] if ones == 0 else f"{TENS[tens * 10]}-{ONES[ones]}"


def ordinal(n: int) -> str:
    if 11 <= n % 100 <= 13:
        return f"{n}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plural(noun: str) -> str:
    return noun + "es" if noun.endswith(("s", "sh", "ch", "x", "z")) else noun + "s"


def article(noun: str) -> str:
    if noun.startswith("HDMI"):
        return "an"
    if noun.startswith("USB"):
        return "a"
    return "an" if noun[0].lower() in "aeiou" else "a"


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def many_of(product: tuple[str, str | None]) -> str:
    """The product in the plural: 'desk lamps', 'bags of espresso beans 1kg'."""
    name, container = product
    return plural(name) if container is None else f"{plural(container)} of {name}"


def unit_word(product: tuple[str, str | None], quantity: int) -> str:
    """What the product is counted in, for 'need 5 more bags': 'units' for plain products."""
    _, container = product
    word = "unit" if container is None else container
    return word if quantity == 1 else plural(word)


def quantity_alone(rng: random.Random, n: int, fancy: bool = True) -> str:
    """The quantity on its own: '3', 'three', 'a dozen' (fancy forms only if `fancy`)."""
    options = [str(n), str(n), number_words(n)]
    if fancy and n == 12:
        options.append("a dozen")
    if fancy and n == 24:
        options.append("two dozen")
    if fancy and n == 6:
        options.append("half a dozen")
    if fancy and n == 2:
        options.append("a pair")
    return rng.choice(options)


def items_phrase(rng: random.Random, product: tuple[str, str | None], n: int) -> str:
    """Quantity and product together: 'three USB-C chargers', 'a pair of desk lamps', 'a bag of ...'."""
    name, container = product
    if n == 1:
        one = name if container is None else f"{container} of {name}"
        return rng.choice([f"{article(one)} {one}", f"one {one}", f"a single {one}"])
    many = many_of(product)
    options = [f"{n} {many}", f"{n} {many}", f"{number_words(n)} {many}"]
    if n == 2:
        options.append(f"a pair of {many}")
    if n == 6:
        options.append(f"half a dozen {many}")
    if n == 12:
        options += [f"a dozen {many}", f"a dozen {many}"]
    if n == 24:
        options.append(f"two dozen {many}")
    return rng.choice(options)


def date_forms(d: datetime.date) -> list[str]:
    """Every way a message may write `d`. Slash and dot forms only when the day is above 12, so that
    day and month cannot be swapped."""
    month, abbr, weekday = MONTHS[d.month - 1], MONTH_ABBREVIATIONS[d.month - 1], WEEKDAYS[d.weekday()]
    forms = [
        f"{month} {d.day}",
        f"{month} {ordinal(d.day)}",
        f"{d.day} {month}",
        f"the {ordinal(d.day)} of {month}",
        f"{month} {d.day}, {d.year}",
        f"{d.day} {month} {d.year}",
        f"{abbr} {d.day}",
        f"{d.day} {abbr} {d.year}",
        d.isoformat(),
        d.isoformat(),
        f"{weekday}, {month} {d.day}",
        f"{weekday} {ordinal(d.day)} {month}",
    ]
    if d.day > 12:
        forms += [
            f"{d.day:02d}/{d.month:02d}/{d.year}",
            f"{d.month:02d}/{d.day:02d}/{d.year}",
            f"{d.day:02d}.{d.month:02d}.{d.year}",
        ]
    return forms


def email_address(name: str) -> str:
    """'Ana López' -> 'ana.lopez@example.com' (ASCII, a reserved example domain)."""
    ascii_name = unicodedata.normalize("NFKD", name.replace("ł", "l").replace("ı", "i"))
    ascii_name = "".join(ch for ch in ascii_name if ch.isascii() and (ch.isalnum() or ch in " -"))
    local = ".".join(ascii_name.lower().replace("-", " ").split())
    domain = "example.com" if len(name) % 2 else "example.org"
    return f"{local}@{domain}"


def tidy(text: str) -> str:
    """One space between words, no space before punctuation, no empty sentences left by empty fields."""
    lines = []
    for line in text.split("\n"):
        line = " ".join(line.split())
        for mark in ".,?!":
            line = line.replace(f" {mark}", mark)
        line = line.replace(". .", ".").replace("..", ".")
        lines.append(line)
    return "\n".join(lines).strip()


# --------------------------------------------------------------------------------------------------------
# One order
# --------------------------------------------------------------------------------------------------------


def pick_quantity(rng: random.Random) -> int:
    """1..50, small orders more likely than large ones."""
    population = list(range(1, 51))
    weights = [4 if n <= 12 else 2 if n <= 25 else 1 for n in population]
    return rng.choices(population, weights)[0]


def pick_name(rng: random.Random) -> str:
    firsts, lasts = NAMES[rng.choice(sorted(NAMES))]
    return f"{rng.choice(firsts)} {rng.choice(lasts)}"


def order_ref(rng: random.Random) -> str:
    number = rng.randint(10000, 99999)
    return rng.choice([f"#{number}", f"order #{number}", f"ORD-{number}", f"ticket {rng.randint(3000, 9999)}"])


def phone_number(rng: random.Random) -> str:
    return rng.choice(
        [
            f"+44 7700 900{rng.randint(100, 999)}",
            f"(555) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
            f"+1 555 {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
            f"0{rng.randint(20, 99)} {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}",
        ]
    )


def price(rng: random.Random) -> str:
    cents = rng.choice(["00", "49", "50", "95", "99"])
    return f"{rng.choice(['$', '€', '£'])}{rng.randint(3, 480)}.{cents}"


def street_address(rng: random.Random) -> str:
    address = f"{rng.randint(2, 240)} {rng.choice(STREETS)}"
    return address if rng.random() < 0.7 else f"unit {rng.randint(1, 30)}, {address}"


def other_items(rng: random.Random, product: tuple[str, str | None], quantity: int) -> tuple[str, int]:
    """An earlier order of something else in another quantity, as a distractor."""
    other = rng.choice([p for p in PRODUCTS if p != product])
    n = rng.choice([k for k in range(1, 21) if k != quantity])
    return items_phrase(rng, other, n), n


def email_distractor(rng: random.Random, product: tuple[str, str | None], quantity: int) -> str:
    kind = rng.choice(["none", "ref", "account", "phone", "price", "address", "previous", "previous"])
    if kind == "ref":
        return rng.choice(
            [
                "My last order was {x}.",
                "For reference, our previous order was {x}.",
                "This is unrelated to {x}, which arrived fine.",
            ]
        ).format(x=order_ref(rng))
    if kind == "account":
        return rng.choice(["Our customer number is {x}.", "Account {x}, in case you need it."]).format(
            x=rng.randint(10000, 99999)
        )
    if kind == "phone":
        return rng.choice(["You can reach me on {x}.", "Call {x} if anything is unclear."]).format(x=phone_number(rng))
    if kind == "price":
        return rng.choice(["Your site lists them at {x}.", "The catalogue price I saw was {x}."]).format(x=price(rng))
    if kind == "address":
        return rng.choice(["Ship to {x}, please.", "We have moved to {x}."]).format(x=street_address(rng))
    if kind == "previous":
        items, _ = other_items(rng, product, quantity)
        return rng.choice(
            [
                "My previous order of {x} arrived fine.",
                "We bought {x} from you last year.",
                "Thanks again for sending {x} before.",
            ]
        ).format(x=items)
    return ""


def chat_distractor(rng: random.Random, product: tuple[str, str | None], quantity: int) -> str:
    kind = rng.choice(["none", "ref", "phone", "price", "previous"])
    if kind == "ref":
        return rng.choice(["{x} was mine too.", "(last one was {x})"]).format(x=order_ref(rng))
    if kind == "phone":
        return rng.choice(["my number's {x}.", "text me on {x}."]).format(x=phone_number(rng))
    if kind == "price":
        return rng.choice(["saw them for {x} on your site.", "still {x}?"]).format(x=price(rng))
    if kind == "previous":
        items, _ = other_items(rng, product, quantity)
        return rng.choice(["got {x} from you before.", "got {x} from you last time, all great."]).format(x=items)
    return ""


def signature(rng: random.Random, name: str, company: str) -> str:
    kind = rng.choice(["name", "name", "role", "company", "phone"])
    if kind == "role":
        return f"{name}\n{rng.choice(ROLES)}, {company}"
    if kind == "company":
        return f"{name}\n{company}"
    if kind == "phone":
        return f"{name}\nTel. {phone_number(rng)}"
    return name


def fields_for(
    rng: random.Random,
    name: str,
    product: tuple[str, str | None],
    quantity: int,
    date: datetime.date | None,
) -> dict[str, str]:
    """Every field any template may use, for one order. Unused fields still draw from `rng`, which keeps
    the code simple and the output deterministic."""
    company = rng.choice(COMPANIES)
    previous_items, previous_quantity = other_items(rng, product, quantity)
    more = f"{quantity_alone(rng, quantity, fancy=False)} more"
    if product[1] is not None:
        more += f" {unit_word(product, quantity)}"
    items = items_phrase(rng, product, quantity)
    if date is None:
        when = ""
        date_sentence = rng.choice(NO_DATE_SENTENCES)
        date_field = rng.choice(NO_DATE_FIELDS)
        date_answer = rng.choice(NO_DATE_ANSWERS)
    else:
        date_text = rng.choice(date_forms(date))
        when = f" {rng.choice(DATE_PREPOSITIONS)} {date_text}"
        date_sentence = rng.choice(DATE_SENTENCES).format(date=date_text)
        date_field = date_text
        date_answer = date_text
    fields = {
        "name": name,
        "product": product[0],
        "many": many_of(product),
        "items": items,
        "Items": capitalize(items),
        "more": more,
        "amount": f"{quantity_alone(rng, quantity, fancy=False)} {unit_word(product, quantity)}",
        "qty_field": quantity_alone(rng, quantity) if rng.random() < 0.3 else str(quantity),
        "qty_digits": str(quantity),
        "when": when,
        "date_sentence": date_sentence,
        "date_field": date_field,
        "date_answer": date_answer,
        "company": company,
        "intro_tail": rng.choice(INTRO_TAILS).format(company=company),
        "reason": rng.choice(REASONS),
        "extra": rng.choice(EMAIL_EXTRAS),
        "comment": " ".join(rng.sample(WEB_COMMENTS, rng.choice([1, 1, 2]))),
        "filler": rng.choice(CHAT_FILLERS),
        "chatter": ". ".join(rng.sample(CHAT_FILLERS, rng.choice([1, 2, 2]))),
        "distractor": email_distractor(rng, product, quantity),
        "chat_distractor": chat_distractor(rng, product, quantity),
        "no_quantity_distractor": rng.choice(["", f"Our customer number is {rng.randint(10000, 99999)}."]),
        "previous": rng.choice(
            ["Last time I ordered {x} and they were great.", "We had {x} from you before and were very happy."]
        ).format(x=previous_items),
        "previous_quantity": str(previous_quantity),
        "price": price(rng),
        "ref": order_ref(rng),
        "account": str(rng.randint(10000, 99999)),
        "phone": phone_number(rng),
        "address": street_address(rng),
        "email": email_address(name),
        "department": rng.choice(DEPARTMENTS),
    }
    return fields


def wrap_email(rng: random.Random, body: str, fields: dict[str, str], multi_turn: bool = False) -> str:
    """Greeting, body, sign-off and signature. Only a short body in a single-turn conversation may get an
    opening sentence, a subject line and a second signature line, which keeps every conversation well
    under 200 tokens."""
    short = not multi_turn and len(body.split()) < MAX_EMAIL_BODY_WORDS
    opener = rng.choice(EMAIL_OPENERS) if short else ""
    text = f"{rng.choice(GREETINGS)}\n\n{opener} {body}\n\n{rng.choice(SIGNOFFS)}\n"
    text += signature(rng, fields["name"], fields["company"]) if short else fields["name"]
    if short and rng.random() < 0.3:
        text = f"Subject: {rng.choice(SUBJECTS)}\n\n{text}"
    return text


def single_turn_message(rng: random.Random, channel: str, fields: dict[str, str]) -> str:
    if channel == "email":
        return tidy(wrap_email(rng, rng.choice(EMAIL_BODIES).format(**fields), fields))
    if channel == "chat":
        return tidy(rng.choice(CHAT_TEMPLATES).format(**fields))
    return tidy(rng.choice(WEB_FORM_TEMPLATES).format(**fields))


def multi_turn_message(rng: random.Random, channel: str, fields: dict[str, str]) -> str:
    template = rng.choice(MULTI_TURN_TEMPLATES[channel])
    if channel == "email":
        return tidy(wrap_email(rng, template.format(**fields), fields, multi_turn=True))
    return tidy(template.format(**fields))


def make_row(rng: random.Random, channel: str, multi_turn: bool, has_date: bool) -> dict:
    name = pick_name(rng)
    product = rng.choice(PRODUCTS)
    quantity = pick_quantity(rng)
    date = datetime.date(YEAR, 1, 1) + datetime.timedelta(days=rng.randrange(365)) if has_date else None
    fields = fields_for(rng, name, product, quantity, date)
    answer = json.dumps(
        {
            "customer": name,
            "product": product[0],
            "quantity": quantity,
            "delivery_date": date.isoformat() if date else None,
        },
        ensure_ascii=False,  # "López", not "L\u00f3pez": the model should copy the name as written
    )
    messages = [{"role": "system", "content": SYSTEM}]
    if multi_turn:
        question = rng.choice(CLARIFYING_QUESTIONS).format(many=fields["many"])
        reply = rng.choice(QUANTITY_ANSWERS).format(qty=quantity_alone(rng, quantity))
        messages += [
            {"role": "user", "content": multi_turn_message(rng, channel, fields)},
            {"role": "assistant", "content": question},
            {"role": "user", "content": capitalize(reply)},
        ]
    else:
        messages.append({"role": "user", "content": single_turn_message(rng, channel, fields)})
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "channel": channel}


def make_rows() -> list[dict]:
    """N_ROWS rows: channels in equal thirds; multi-turn and no-date rows spread evenly over the channels;
    the order shuffled."""
    rng = random.Random(SEED)
    per_channel = N_ROWS // len(CHANNELS)
    plan = []
    for channel in CHANNELS:
        for i in range(per_channel):
            multi_turn = i < N_MULTI_TURN // len(CHANNELS)
            # No-date rows are counted from the other end, so multi-turn rows always have a date.
            has_date = i < per_channel - N_NO_DATE // len(CHANNELS)
            plan.append((channel, multi_turn, has_date))
    rng.shuffle(plan)
    return [make_row(rng, *entry) for entry in plan]


# --------------------------------------------------------------------------------------------------------
# Checks on what was written
# --------------------------------------------------------------------------------------------------------


SPECIAL_QUANTITY_FORMS = {
    1: ["a", "an", "a single"],
    2: ["a pair"],
    6: ["half a dozen"],
    12: ["a dozen"],
    24: ["two dozen"],
}


def quantity_forms(n: int) -> list[str]:
    """Every way a message may write the quantity `n`."""
    return [str(n), number_words(n), *SPECIAL_QUANTITY_FORMS.get(n, [])]


def contains_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text, flags=re.IGNORECASE) is not None


def check(path: Path) -> dict[str, int]:
    """Assert the properties the generator promises; return counts for a summary."""
    counts = {"rows": 0, "multi_turn": 0, "no_date": 0, "email": 0, "web-form": 0, "chat": 0}
    words: list[int] = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line)
        where = f"{path.name}:{line_number}"
        assert set(row) == {"messages", "channel"}, where
        messages = row["messages"]
        assert messages[0] == {"role": "system", "content": SYSTEM}, where
        assert [m["role"] for m in messages[1:]] in (
            ["user", "assistant"],
            ["user", "assistant", "user", "assistant"],
        ), where
        answer = json.loads(messages[-1]["content"])
        assert list(answer) == ["customer", "product", "quantity", "delivery_date"], where
        assert messages[-1]["content"] == json.dumps(answer, ensure_ascii=False), f"{where}: not canonical JSON"
        user_text = "\n".join(m["content"] for m in messages if m["role"] == "user")
        assert answer["customer"] in user_text, f"{where}: name not in the message"
        assert answer["product"] in user_text, f"{where}: product not in the message"
        quantity = answer["quantity"]
        assert isinstance(quantity, int) and 1 <= quantity <= 50, where
        assert any(contains_word(user_text, form) for form in quantity_forms(quantity)), f"{where}: quantity"
        if len(messages) == 5:
            counts["multi_turn"] += 1
            answer_turn = messages[3]["content"]
            assert any(contains_word(answer_turn, form) for form in quantity_forms(quantity)), where
        date = answer["delivery_date"]
        if date is None:
            counts["no_date"] += 1
            assert str(YEAR) not in user_text, f"{where}: a year in a message without a date"
            assert not any(contains_word(user_text, month) for month in MONTHS if month != "May"), where
        else:
            forms = date_forms(datetime.date.fromisoformat(date))
            assert any(form in user_text for form in forms), f"{where}: date not in the message"
        counts[row["channel"]] += 1
        counts["rows"] += 1
        words.append(len(messages[1]["content"].split()))
    counts["min_words"], counts["max_words"] = min(words), max(words)
    counts["mean_words"] = round(sum(words) / len(words))
    return counts


def main() -> None:
    rows = make_rows()
    with OUTPUT.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = check(OUTPUT)
    print(f"wrote {OUTPUT.name}: " + ", ".join(f"{key} {value}" for key, value in counts.items()))


if __name__ == "__main__":
    main()
