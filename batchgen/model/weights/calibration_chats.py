"""More calibration chats for ``--quantization fp8``: they extend ``calibration_text.CHATS``."""

from __future__ import annotations

from batchgen.model.weights.calibration_chats2 import LATER_CHATS

_CHATS: tuple[tuple[str, str], ...] = (
    (
        "Write a Python function that counts how often each word appears in a text.",
        "```python\nfrom collections import Counter\nimport re\n\n\ndef word_counts(text):\n    words = "
        're.findall(r"[a-z\']+", text.lower())\n    return Counter(words)\n```\nThe regular expression '
        "keeps letters and apostrophes, and lowering the case first means 'The' and 'the' are counted "
        "together. `word_counts(\"the fox saw the dog\").most_common(1)` returns `[('the', 2)]`. A "
        "`Counter` behaves like a dictionary, so you can also look up a single word with `counts['dog']`, "
        "which gives 0 rather than an error for words that never appear.",
    ),
    (
        "Write a Rust function that computes a factorial without overflowing silently.",
        "```rust\nfn factorial(n: u64) -> Option<u64> {\n    (1..=n).try_fold(1u64, |acc, k| "
        'acc.checked_mul(k))\n}\n\nfn main() {\n    println!("{:?}", factorial(20)); // '
        'Some(2432902008176640000)\n    println!("{:?}", factorial(21)); // None\n}\n```\n`checked_mul` '
        "returns `None` as soon as a product no longer fits in a `u64`, and `try_fold` stops at the first "
        "`None`, so the caller has to handle the overflow instead of getting a wrong number. 20! is the "
        "largest factorial that fits in 64 unsigned bits.",
    ),
    (
        "Show me how to swap two integers through pointers in C.",
        "```c\n#include <stdio.h>\n\nvoid swap(int *a, int *b) {\n    int tmp = *a;\n    *a = *b;\n    *b "
        '= tmp;\n}\n\nint main(void) {\n    int x = 3, y = 8;\n    swap(&x, &y);\n    printf("x=%d '
        'y=%d\\n", x, y);\n    return 0;\n}\n```\nThe function receives the addresses of `x` and `y`, so '
        "the writes through `*a` and `*b` change the caller's variables rather than copies of them. The "
        "program prints `x=8 y=3`. Passing `x` and `y` directly would only swap local copies inside the "
        "function.",
    ),
    (
        "How do I center a box in the middle of the page with CSS?",
        "Flexbox does it with a few rules on the parent:\n```html\n<body>\n  <div "
        'class="card">Hello</div>\n</body>\n```\n```css\nbody {\n  margin: 0;\n  min-height: 100vh;\n  '
        "display: flex;\n  justify-content: center; /* horizontal */\n  align-items: center;     /* "
        "vertical */\n}\n```\n`min-height: 100vh` makes the body as tall as the window, so there is room "
        "to center vertically. With CSS grid, `display: grid; place-items: center;` on the parent has the "
        "same effect.",
    ),
    (
        "Give me a regular expression that matches dates like 2024-03-15.",
        "```regex\n^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$\n```\n- `\\d{4}` is the four-digit "
        "year.\n- `(0[1-9]|1[0-2])` allows the months 01 to 12.\n- `(0[1-9]|[12]\\d|3[01])` allows the "
        "days 01 to 31.\n- `^` and `$` anchor the pattern, so nothing else may surround the date.\n\nIt "
        "rejects `2024-13-01` but still accepts `2023-02-30`, so check the calendar in code if impossible "
        "days matter.",
    ),
    (
        "Write a docker-compose file that runs PostgreSQL with a persistent volume.",
        "```yaml\nservices:\n  db:\n    image: postgres:16\n    restart: unless-stopped\n    environment:\n"
        "      POSTGRES_USER: app\n      POSTGRES_PASSWORD: change-me\n      POSTGRES_DB: appdb\n    "
        'ports:\n      - "5432:5432"\n    volumes:\n      - pgdata:/var/lib/postgresql/data\n\nvolumes:\n'
        "  pgdata:\n```\nStart it with `docker compose up -d`. The named volume `pgdata` keeps the data "
        "when the container is removed or upgraded. For anything beyond local testing, put the password in "
        "an `.env` file rather than in the compose file itself.",
    ),
    (
        "Make a table comparing hard drives, SATA SSDs and NVMe SSDs.",
        "| Type | Typical read speed | Cost per TB | Best for |\n|---|---|---|---|\n| Hard drive (HDD) | "
        "100-250 MB/s | Lowest | Backups, large archives |\n| SATA SSD | about 550 MB/s | Medium | "
        "Upgrading older laptops |\n| NVMe SSD | 3 000-7 000 MB/s | Medium to high | System drive, games, "
        "video editing |\n\nHard drives have spinning platters, so they are slower and more fragile, but "
        "they are still the cheapest way to store many terabytes. Neither kind of SSD has moving parts; "
        "NVMe drives connect over PCIe lanes and so avoid the SATA bottleneck.",
    ),
    (
        "Write a short dialogue between a customer returning a broken hair dryer and a shop assistant.",
        "Customer: Hi, I bought this hair dryer last week and it has stopped switching on.\nAssistant: I'm "
        "sorry about that. Do you have the receipt?\nCustomer: Yes, here it is.\nAssistant: Thank you. "
        "It's well within the thirty-day return period. Would you like a replacement or a refund?\n"
        "Customer: A replacement, please. I liked it while it worked.\nAssistant: Of course. I'll fetch a "
        "new one from the stockroom and test it here before you go.\nCustomer: That's very kind, thanks.",
    ),
    (
        "Give me a simple recipe for red lentil soup.",
        "**Serves 4**\n\nIngredients: 1 onion, 2 carrots, 2 cloves of garlic, 2 tbsp olive oil, 250 g red "
        "lentils, 1 tin of chopped tomatoes, 1.2 litres of vegetable stock, 1 tsp ground cumin, black "
        "pepper and a spoonful of yogurt per bowl.\n\n1. Chop the onion and carrots and fry them in the "
        "oil for 5 minutes.\n2. Add the garlic and cumin and stir for 1 minute.\n3. Add the rinsed "
        "lentils, tomatoes and stock, bring to a simmer and cook for 20 minutes.\n4. Blend until smooth, "
        "season to taste and top with the yogurt.",
    ),
    (
        "Write a letter to my landlord about the broken heating.",
        "Dear Mr Patel,\n\nI am writing to let you know that the heating in flat 3B has not worked since "
        "Monday 4 November. The boiler shows an error light and the radiators stay cold, even after I "
        "reset it as the manual describes.\n\nWith the nights getting colder, I would be grateful if you "
        "could arrange for an engineer to visit as soon as possible. I am at home most mornings and can "
        "give access at short notice.\n\nThank you for your help.\n\nYours sincerely,\nEmma Clarke",
    ),
    (
        "Write a free-verse poem about the last bus of the night.",
        "The last bus hums through empty streets,\nits windows yellow squares of light.\nA nurse dozes "
        "against the glass,\nher shoes untied, her badge still on.\nTwo students share one pair of "
        "earphones\nand a song nobody else can hear.\nThe driver nods at every stop\nwhether anyone waits "
        "or not,\nas if the city itself\nmight want to climb aboard\nand be carried, quietly,\nhome.",
    ),
    (
        "Solve 3x + 7 = 22 step by step.",
        "1. Start with the equation: 3x + 7 = 22.\n2. Subtract 7 from both sides to isolate the term with "
        "x: 3x = 22 - 7 = 15.\n3. Divide both sides by 3: x = 15 / 3 = 5.\n4. Check the answer by putting "
        "it back into the original equation: 3 x 5 + 7 = 15 + 7 = 22, which matches the right-hand side.\n"
        "\nSo the solution is x = 5. The same two moves, undoing the addition and then the multiplication, "
        "solve any equation of the form ax + b = c.",
    ),
    (
        "Summarise in two sentences: Around 1440 Johannes Gutenberg, a goldsmith from Mainz, developed a "
        "press with movable metal type. Earlier books were copied by hand or printed from carved wooden "
        "blocks, which was slow and costly. His system let printers set pages from reusable letters and "
        "print hundreds of copies quickly. Within fifty years presses were working in more than two "
        "hundred European cities, books became cheaper, and ideas spread faster than ever before.",
        "Here is a two-sentence summary:\n\nAround 1440 Johannes Gutenberg of Mainz invented a printing "
        "press with reusable movable metal type, which made printing far faster and cheaper than copying "
        "by hand or carving wooden blocks. Within fifty years presses were operating in over two hundred "
        "European cities, making books affordable and spreading ideas more quickly than ever.",
    ),
    (
        "Classify these animals as mammal, bird or reptile: goat, penguin, gecko, bat, crocodile, sparrow, "
        "hedgehog, tortoise.",
        "- **Mammals:** goat, bat, hedgehog. They have hair or fur and feed their young on milk; the bat "
        "is the only mammal that truly flies.\n- **Birds:** penguin, sparrow. Both have feathers and lay "
        "hard-shelled eggs, even though the penguin cannot fly.\n- **Reptiles:** gecko, crocodile, "
        "tortoise. They have scaly skin, and most lay their eggs on land.\n\nA common mix-up is the bat, "
        "which people sometimes call a bird because it has wings.",
    ),
    (
        "Extract the product details from this text as JSON: 'The TrailLite 2 tent weighs 1.8 kg, sleeps "
        "two people, costs 249 euros and comes in green or orange.'",
        '```json\n{\n  "name": "TrailLite 2",\n  "category": "tent",\n  "weight_kg": 1.8,\n  '
        '"capacity_people": 2,\n  "price": {"amount": 249, "currency": "EUR"},\n  "colours": '
        '["green", "orange"]\n}\n```\nI stored the weight and the price as numbers rather than strings '
        "so they can be compared or sorted, used the standard currency code EUR, and put the colours in a "
        "list because the tent comes in more than one.",
    ),
    (
        "Make this sentence more concise: 'At this point in time we are currently in the process of "
        "reviewing all of the applications that have been submitted.'",
        "A shorter version: 'We are reviewing all submitted applications.'\n\nWhat changed:\n- 'At this "
        "point in time' and 'currently' both mean 'now', and the present continuous already says that, so "
        "both go.\n- 'in the process of reviewing' becomes simply 'reviewing'.\n- 'all of the applications "
        "that have been submitted' becomes 'all submitted applications'.\n\nThe meaning is the same, but "
        "the sentence drops from 21 words to 6.",
    ),
    (
        "List the people, places and dates in this paragraph: 'Marie Curie was born in Warsaw in 1867. She "
        "moved to Paris in 1891 to study at the Sorbonne, and in 1903 she shared the Nobel Prize in "
        "Physics with Pierre Curie and Henri Becquerel.'",
        "People:\n- Marie Curie\n- Pierre Curie\n- Henri Becquerel\n\nPlaces:\n- Warsaw, where Marie Curie "
        "was born\n- Paris, where she moved\n- The Sorbonne, where she studied\n\nDates:\n- 1867: Marie "
        "Curie is born\n- 1891: she moves to Paris to study\n- 1903: she shares the Nobel Prize in Physics "
        "with Pierre Curie and Henri Becquerel\n\nThe paragraph does not mention her second Nobel Prize, "
        "in Chemistry in 1911.",
    ),
    (
        "Grade this student answer out of 5. Question: What do red blood cells do? Answer: 'They fight "
        "infections and carry food around the body.'",
        "Score: 1 / 5.\n\nThe answer is mostly incorrect. Fighting infections is the job of white blood "
        "cells, not red ones, and nutrients are carried mainly by the plasma. The key point is missing: "
        "red blood cells carry oxygen from the lungs to the tissues, using the protein haemoglobin, and "
        "help carry carbon dioxide back to the lungs. I gave one mark because the student correctly sees "
        "that blood transports substances around the body. A full answer would name oxygen and haemoglobin.",
    ),
    (
        "Translate into German: Could you tell me where the nearest pharmacy is?",
        "In German: 'Könnten Sie mir sagen, wo die nächste Apotheke ist?'\n\nA few notes:\n- 'Könnten Sie' "
        "is the polite form, right for speaking to a stranger; with a friend you would say 'Kannst du mir "
        "sagen ...'.\n- In the clause introduced by 'wo', the verb 'ist' moves to the end.\n- 'Apotheke' "
        "is the pharmacy; a 'Drogerie' sells toiletries and cosmetics but usually no prescription "
        "medicines.",
    ),
    (
        "Translate into Spanish: Our flight was delayed by two hours because of the fog.",
        "'Nuestro vuelo se retrasó dos horas a causa de la niebla.'\n\nNotes on the choices:\n- 'Se "
        "retrasó' is the usual way to say a flight was delayed; 'fue retrasado' is grammatical but sounds "
        "stiff.\n- Spanish needs no word for 'by' before the amount of time.\n- 'A causa de' can be "
        "replaced by 'por', which is shorter and just as common in speech: 'por la niebla'.",
    ),
    (
        "Translate into Italian: I would like to book a table for four people tomorrow evening.",
        "'Vorrei prenotare un tavolo per quattro persone per domani sera.'\n\n- 'Vorrei' (I would like) is "
        "the polite conditional of 'volere' and is what Italians use in shops and restaurants.\n- "
        "'Prenotare' means to book or reserve.\n- 'Domani sera' is tomorrow evening; the second 'per' says "
        "the booking is for that time.\n\nOn the phone you might add 'verso le otto' (around eight) and "
        "give your name: 'a nome di Rossi'.",
    ),
    (
        "Why do we get goosebumps?",
        "Goosebumps appear when tiny muscles at the base of each hair, called arrector pili, contract and "
        "pull the hairs upright, pushing the skin around them into small bumps. The reaction is controlled "
        "by the sympathetic nervous system, so it happens with cold and also with fear or a moving piece "
        "of music. In our furrier ancestors, raised hair trapped a thicker layer of warm air and made the "
        "animal look bigger to threats. In humans, with little body hair, it is mostly a leftover reflex.",
    ),
    (
        "Why is the Magna Carta important?",
        "The Magna Carta was agreed by King John of England with rebellious barons in 1215. Most of its "
        "clauses dealt with feudal matters of the time, and the Pope annulled it within months, but it was "
        "reissued several times afterwards. Its lasting importance is the principle that the king was not "
        "above the law: no free man could be imprisoned or stripped of his rights except by lawful "
        "judgment. Later generations used it as a symbol of limited government, and it influenced "
        "documents such as the US Bill of Rights.",
    ),
    (
        "What was the Silk Road?",
        "The Silk Road was a network of trade routes linking China with Central Asia, Persia, the Middle "
        "East and the Mediterranean, used from around the 2nd century BC until about the 15th century. Few "
        "traders travelled the whole way; goods passed from merchant to merchant through caravan stops and "
        "trading cities such as Samarkand. Silk, spices, porcelain, horses and glass moved along it, and "
        "so did religions such as Buddhism and Islam, inventions such as gunpowder, and, less happily, "
        "diseases such as the plague.",
    ),
    (
        "How do I get a red wine stain out of a carpet?",
        "Act quickly and don't rub, which pushes the wine deeper.\n1. Blot up as much as you can with a "
        "clean white cloth or kitchen towel.\n2. Pour a little cold water on the stain and blot again to "
        "dilute it.\n3. Mix one tablespoon of washing-up liquid and one of white vinegar in two cups of "
        "warm water, sponge it on and blot until the colour lifts.\n4. Rinse with cold water and blot "
        "dry.\n\nFor an old stain, a paste of baking soda and water, left to dry and then vacuumed, can "
        "help. Test any cleaner on a hidden corner first.",
    ),
    (
        "How should I give constructive feedback to a colleague?",
        "Give it privately and soon after the event, while the details are fresh. Describe a specific "
        "behaviour and its effect rather than judging the person: 'In the client call, the figures on "
        "slide four were out of date, and the client questioned our numbers' works better than 'You're "
        "careless.' Ask for their view before suggesting anything, since there may be a reason you don't "
        "know. Agree together on one concrete next step, and mention what they did well too, but don't "
        "wrap the criticism so thickly in praise that the message gets lost.",
    ),
    (
        "What is the difference between a sprain and a strain?",
        "A sprain is an injury to a ligament, the tough band that connects one bone to another at a joint; "
        "ankles and wrists are the usual victims, often after a twist or a fall. A strain is an injury to "
        "a muscle or to a tendon, which attaches muscle to bone; the hamstrings and the lower back are "
        "common spots, often after overstretching or heavy lifting. Both cause pain and swelling and are "
        "usually treated at first with rest, ice, compression and elevation. See a doctor if you cannot "
        "bear weight or the joint looks deformed.",
    ),
    (
        "How do I cook fluffy white rice on the stove?",
        "1. Rinse 1 cup of long-grain rice in a sieve until the water runs almost clear; this removes "
        "surface starch that makes it sticky.\n2. Put it in a pot with 1.5 cups of cold water.\n3. Bring "
        "it to a simmer, then cover with a tight lid and turn the heat to the lowest setting.\n4. Cook for "
        "15 minutes without lifting the lid.\n5. Take it off the heat and let it stand, covered, for 10 "
        "minutes.\n6. Fluff it with a fork and serve.\n\nThis makes about three cups, enough for three or "
        "four people.",
    ),
    (
        "Any tips for beating jet lag after a long flight east?",
        "Flying east is usually harder, because you have to fall asleep earlier than your body wants. A "
        "few days before you leave, go to bed and get up an hour earlier each day. On the plane, set your "
        "watch to the destination's time and sleep or stay awake accordingly. After landing, get bright "
        "daylight in the morning, which resets your internal rhythm fastest, and avoid it in the late "
        "afternoon. Drink water, limit alcohol and caffeine, and keep any nap under thirty minutes.",
    ),
    (
        "What is an index fund?",
        "An index fund is an investment fund that buys all, or a representative sample, of the stocks or "
        "bonds in a market index, such as the S&P 500, instead of having managers pick investments. "
        "Because it simply follows the index, it needs little research and trades rarely, so its fees are "
        "low, often under 0.2 % a year. You get broad diversification in one purchase, and over long "
        "periods most index funds have done better than the majority of actively managed funds after fees. "
        "The trade-off is that you will never beat the market, only match it.",
    ),
    (
        "Using the 50/30/20 rule, how should I split a monthly take-home pay of 3,000 dollars?",
        "The rule divides after-tax income into three parts:\n\n- **Needs, 50 %: $1,500.** Rent, "
        "utilities, groceries, insurance, transport and minimum loan payments.\n- **Wants, 30 %: $900.** "
        "Eating out, hobbies, streaming services, holidays.\n- **Savings and debt, 20 %: $600.** An "
        "emergency fund, retirement contributions and extra debt repayments.\n\nCheck: 1,500 + 900 + 600 = "
        "3,000. If your rent alone takes more than half, treat the split as a target to work towards "
        "rather than a strict limit.",
    ),
    (
        "What is the difference between a process and a thread?",
        "A process is a running program with its own memory space, file handles and other resources, kept "
        "apart from other processes by the operating system. A thread is a path of execution inside a "
        "process, and all threads of one process share its memory. That makes threads cheaper to create "
        "and quicker to communicate, since they can read the same data, but it also means they need locks "
        "or other synchronisation to avoid corrupting shared state. Processes are more isolated: if one "
        "crashes, the others usually keep running.",
    ),
)

MORE_CHATS: tuple[tuple[str, str], ...] = _CHATS + LATER_CHATS
